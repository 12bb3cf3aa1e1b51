"""The HTTP frontend of ``bls serve``: a plain ASGI application over a loaded script.

Routes::

    POST /v1/scripts/{entry}      run an entry (JSON in; JSON, SSE or NDJSON out)
    POST /v1/chat/completions     OpenAI-compatible, for an entry declared openai="chat"
    GET  /v1/models               the chat model(s) served (OpenAI's list shape)
    GET  /v1/scripts              entries with their request/response schemas
    GET  /openapi.json            generated from the message types
    GET  /health                  the process is alive
    GET  /ready                   every bound stage is reachable (503 names those that are not)
    GET  /metrics                 Prometheus text
    GET  /debug/requests[/{id}]   recent requests and their stage timelines

Each accepted request runs its script under one cancel scope. That scope is cancelled
when the client disconnects, when the request's deadline passes, or when a drain runs out
of grace, and with it every stage call under the request, remote work included. Errors
reach the client as ``{"error": {"type", "message", "stage", "path"}}`` with a status
that says whose fault it was; a traceback never does (it goes to the log).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio
import msgspec
import sniffio

from . import chat, openapi, timeline
from .entry import Script
from .errors import DeadlineExceeded, InvalidRequest, StageError, StageNotBound
from .metrics import CONTENT_TYPE as METRICS_TYPE
from .metrics import Metrics
from .runtime import Runtime
from .timeouts import deadline_at, reset_deadline
from .tracing import Trace, TraceStore, activate, deactivate, outcome_of

__all__ = ["Frontend", "HttpError", "Limits"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

log = logging.getLogger("bls.http")
access = logging.getLogger("bls.access")

_JSON = b"application/json"
_SSE = b"text/event-stream"
_NDJSON = b"application/x-ndjson"
_encode = msgspec.json.encode


# How long a request runs before a task starts watching for its client's disconnect.
_WATCH_AFTER = 0.002

# Request ids: random per process, then a counter (os.urandom per request costs more).
_ID_PREFIX = os.urandom(4).hex().encode()
_ids = itertools.count(1)


class Limits(msgspec.Struct, kw_only=True):
    """The frontend's bounds, from ``bls serve``'s flags."""

    max_inflight: int = 64  # accepted requests at once; more get 429
    request_timeout: float | None = 300.0  # upper bound of any request's deadline
    max_body_bytes: int = 16 * 1024 * 1024  # larger bodies get 413, unread
    body_timeout: float = 10.0  # a body that takes longer to arrive gets 408
    grace: float = 30.0  # seconds in-flight requests get on SIGTERM
    trace_keep: int = 100  # finished request traces kept for /debug/requests


class HttpError(Exception):
    """An error answered with ``status`` and the JSON error body."""

    def __init__(
        self,
        status: int,
        type: str,
        message: str,
        *,
        stage: str | None = None,
        path: str | None = None,
        kind: str | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = type
        self.message = message
        self.stage = stage
        self.path = path
        self.kind = kind
        self.headers = headers or []

    def body(self) -> bytes:
        error: dict[str, Any] = {
            "type": self.type,
            "message": self.message,
            "stage": self.stage,
            "path": self.path,
        }
        if self.kind is not None:
            error["kind"] = self.kind
        return _encode({"error": error})


def error_for(exc: BaseException) -> HttpError:
    """The HTTP answer for an exception a request ended with."""
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return error_for(exc.exceptions[0])
    if isinstance(exc, HttpError):
        return exc
    if isinstance(exc, DeadlineExceeded):
        return HttpError(504, "deadline_exceeded", str(exc))
    if isinstance(exc, StageError) and exc.kind == "deadline":
        return HttpError(504, "deadline_exceeded", str(exc), stage=exc.stage)
    if isinstance(exc, StageError):
        path = exc.path if isinstance(exc, InvalidRequest) else None
        if exc.kind in ("unavailable", "overloaded"):
            return HttpError(
                503, "stage_unavailable", exc.message, stage=exc.stage, path=path, kind=exc.kind
            )
        return HttpError(502, "stage_error", exc.message, stage=exc.stage, path=path, kind=exc.kind)
    if isinstance(exc, StageNotBound):
        return HttpError(500, "not_bound", str(exc), stage=exc.stage)
    return HttpError(500, "internal", f"the script failed: {type(exc).__name__}: {exc}")


def _invalid(exc: InvalidRequest) -> HttpError:
    return HttpError(422, "invalid_request", exc.message, stage=exc.stage, path=exc.path)


class _Request:
    """What one accepted request's handling shares with its disconnect watcher."""

    __slots__ = (
        "disconnected",
        "error_frame",
        "finishing",
        "id",
        "scope",
        "shutdown",
        "status",
        "streamed",
    )

    def __init__(self, request_id: str, scope: _Scope) -> None:
        self.id = request_id
        self.scope = scope  # the request's deadline, disconnect and drain
        self.disconnected = False
        self.shutdown = False
        self.finishing = False  # the last body message is being sent
        self.status = 0
        self.streamed = False
        # How an error is framed once a stream has started (SSE by default).
        self.error_frame: Callable[[HttpError], bytes] = _sse_error


class _Scope:
    """The request's cancel scope on trio: anyio's (trio's own, underneath)."""

    __slots__ = ("_scope",)

    def __init__(self) -> None:
        self._scope = anyio.CancelScope()

    def expire_after(self, seconds: float) -> None:
        """Set the deadline (before entering)."""
        self._scope.deadline = anyio.current_time() + seconds

    def cancel(self) -> None:
        self._scope.cancel()

    @property
    def cancelled_caught(self) -> bool:
        return self._scope.cancelled_caught

    async def __aenter__(self) -> None:
        self._scope.__enter__()

    async def __aexit__(self, *exc: Any) -> bool:
        return bool(self._scope.__exit__(*exc))


class _AsyncioScope(_Scope):
    """The same on asyncio, with ``asyncio.timeout``: an anyio scope around a server's
    task costs more there than all the rest of a small request (it is not a task anyio
    started). Scripts inside still use anyio; a native cancel reaches them like any."""

    __slots__ = ("_cancel_early", "_caught", "_exited", "_timeout", "_when")

    def __init__(self) -> None:
        self._when: float | None = None
        self._timeout: asyncio.Timeout | None = None
        self._caught = False
        self._cancel_early = False
        self._exited = False

    def expire_after(self, seconds: float) -> None:
        self._when = asyncio.get_running_loop().time() + seconds

    def cancel(self) -> None:
        """Cancel the request now; before it starts, as it starts; after it ends, never
        (a drain may reach a request that is still sending its answer)."""
        if self._timeout is None:
            self._cancel_early = True
        elif not self._exited and not self._timeout.expired():
            self._timeout.reschedule(-1.0)  # expire now

    @property
    def cancelled_caught(self) -> bool:
        return self._caught

    async def __aenter__(self) -> None:
        self._timeout = asyncio.timeout_at(self._when)
        await self._timeout.__aenter__()
        if self._cancel_early:
            self.cancel()

    async def __aexit__(self, *exc: Any) -> bool:
        assert self._timeout is not None
        self._exited = True
        try:
            await self._timeout.__aexit__(*exc)
        except TimeoutError:
            self._caught = True
            return True
        return False


class _Disconnected(Exception):
    """The client went away before its request body arrived."""


async def _watch(receive: Receive, request: _Request) -> None:
    """Cancel the request when its client goes away (the body has been read already).

    Servers also report a disconnect once the response is complete; that one is not the
    client leaving early, so it is ignored once the last body message is on its way.
    """
    try:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if not request.finishing:
                    request.disconnected = True
                    request.scope.cancel()
                return
    except Exception:  # the server gave up on the connection: nothing left to watch
        log.debug("request %s: disconnect watch ended", request.id, exc_info=True)


def _watch_disconnect(receive: Receive, request: _Request) -> Callable[[], object]:
    """Start :func:`_watch` beside the request; returns what stops it.

    On asyncio this is a bare task, started only once the request has run for
    ``_WATCH_AFTER`` seconds: a task per request costs more than the rest of a small
    request put together, and one that ends sooner has nothing left to cancel. The
    watcher needs none of a task group's guarantees (it never raises, and is always
    stopped before the request's handler returns).
    """
    if isinstance(request.scope, _AsyncioScope):
        loop = asyncio.get_running_loop()
        started: list[asyncio.Task[None]] = []
        timer = loop.call_later(
            _WATCH_AFTER, lambda: started.append(loop.create_task(_watch(receive, request)))
        )

        def stop() -> None:
            timer.cancel()
            if started:
                started[0].cancel()

        return stop
    import trio

    stopper = trio.CancelScope()

    async def watch() -> None:
        with stopper:
            await _watch(receive, request)

    trio.lowlevel.spawn_system_task(watch)
    return stopper.cancel


def _tracking(send: Send, request: _Request) -> Send:
    """``send`` that marks the request as finishing before its last body message."""

    async def tracked(message: Message) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            request.finishing = True
        await send(message)

    return tracked


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


class Frontend:
    """The ASGI application serving one loaded script through ``runtime``."""

    def __init__(
        self,
        entries: dict[str, Script],
        runtime: Runtime,
        *,
        title: str = "bls",
        limits: Limits | None = None,
        export: Callable[[Trace], None] | None = None,
    ) -> None:
        self.entries = entries
        self.runtime = runtime
        self.title = title
        self.limits = limits or Limits()
        self.metrics = Metrics(lambda: self.inflight)
        self.metrics.watch_caches(runtime.bindings)
        self.traces = TraceStore(self.limits.trace_keep)
        self.export = export  # OpenTelemetry, when configured (bls.otel)
        self.inflight = 0
        self.draining = False
        self._requests: set[_Request] = set()
        self._idle: anyio.Event | None = None
        self.chat_entry = next((e for e in entries.values() if e.openai == "chat"), None)
        self._openapi: bytes | None = None
        self._asyncio: bool | None = None  # the event loop, known at the first request
        self._routes: dict[tuple[str, str], Callable[[Scope, Receive, Send], Awaitable[None]]] = {
            ("GET", "/health"): self._health,
            ("GET", "/ready"): self._ready,
            ("GET", "/metrics"): self._metrics,
            ("GET", "/v1/scripts"): self._list,
            ("GET", "/v1/models"): self._models,
            ("GET", "/openapi.json"): self._openapi_json,
            ("GET", "/debug/requests"): self._debug_list,
            ("POST", "/v1/chat/completions"): self._chat,
        }

    # -- ASGI -------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await _lifespan(receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        method, path = scope["method"], scope["path"]
        route = self._routes.get((method, path))
        if route is not None:
            await route(scope, receive, send)
            return
        if path.startswith("/v1/scripts/") and method == "POST":
            await self._script(scope, receive, send, path[len("/v1/scripts/") :])
            return
        if path.startswith("/debug/requests/") and method == "GET":
            await self._debug_page(scope, send, path[len("/debug/requests/") :])
            return
        rid = self._request_id(scope)
        if any(p == path for _, p in self._routes) or path.startswith("/v1/scripts/"):
            allowed = ", ".join(m for m, p in self._routes if p == path) or "POST"
            error = HttpError(
                405,
                "method_not_allowed",
                f"{method} is not allowed on {path}",
                headers=[(b"allow", allowed.encode())],
            )
        else:
            error = HttpError(404, "not_found", f"no route {method} {path}")
        await _send_error(send, error, rid)

    # -- small routes -----------------------------------------------------------------

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _respond(send, 200, b'{"status":"ok"}', self._request_id(scope))

    async def _ready(self, scope: Scope, receive: Receive, send: Send) -> None:
        rid = self._request_id(scope)
        if self.draining:
            error = HttpError(503, "draining", "the server is shutting down")
            await _send_error(send, error, rid)
            return
        down = [name for name, b in self.runtime.bindings.items() if not b.ready()]
        if down:
            error = HttpError(
                503,
                "stage_unavailable",
                f"stage(s) not reachable: {', '.join(down)}",
                stage=down[0],
            )
            await _send_error(send, error, rid)
            return
        await _respond(send, 200, _encode({"status": "ready"}), rid)

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = self.metrics.render()
        await _respond(send, 200, body, self._request_id(scope), METRICS_TYPE.encode())

    async def _list(self, scope: Scope, receive: Receive, send: Send) -> None:
        listing = []
        for entry in self.entries.values():
            request, response = openapi.entry_schemas(entry)
            listing.append(
                {
                    "name": entry.name,
                    "path": f"/v1/scripts/{entry.name}",
                    "streaming": entry.streaming,
                    "openai": entry.openai,
                    "request": request,
                    "response": response,
                }
            )
        await _respond(send, 200, _encode({"scripts": listing}), self._request_id(scope))

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        names = [e.model or e.name for e in self.entries.values() if e.openai == "chat"]
        await _respond(send, 200, chat.models(names), self._request_id(scope))

    async def _openapi_json(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._openapi is None:
            self._openapi = _encode(openapi.document(self.entries, self.title))
        await _respond(send, 200, self._openapi, self._request_id(scope))

    async def _debug_list(self, scope: Scope, receive: Receive, send: Send) -> None:
        rid = self._request_id(scope)
        if b"application/json" in (_header(scope, b"accept") or b""):
            body = _encode([timeline.summary(t) for t in self.traces.recent()])
            await _respond(send, 200, body, rid)
            return
        page = timeline.index_page(self.traces.recent(), self.title)
        await _respond(send, 200, page.encode(), rid, b"text/html; charset=utf-8")

    async def _debug_page(self, scope: Scope, send: Send, trace_id: str) -> None:
        rid = self._request_id(scope)
        trace = self.traces.get(trace_id)
        if trace is None:
            error = HttpError(404, "not_found", f"no recent request with id {trace_id!r}")
            await _send_error(send, error, rid)
            return
        if b"application/json" in (_header(scope, b"accept") or b""):
            await _respond(send, 200, _encode(timeline.summary(trace, spans=True)), rid)
            return
        body = timeline.trace_page(trace).encode()
        await _respond(send, 200, body, rid, b"text/html; charset=utf-8")

    # -- running entries --------------------------------------------------------------

    def _request_id(self, scope: Scope) -> bytes:
        given = _header(scope, b"x-request-id")
        if given and len(given) <= 128 and given.isascii():
            return given
        return b"%s%08x" % (_ID_PREFIX, next(_ids))

    async def _script(self, scope: Scope, receive: Receive, send: Send, name: str) -> None:
        entry = self.entries.get(name)
        if entry is None:
            error = HttpError(
                404,
                "not_found",
                f"no entry {name!r} (entries: {', '.join(self.entries)})",
            )
            await _send_error(send, error, self._request_id(scope))
            return
        await self._accept(scope, receive, send, entry, self._run_entry)

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        entry = self.chat_entry
        if entry is None:
            why = "no entry serves chat: declare one with @bls.script(openai='chat')"
            error = HttpError(404, "not_found", why)
            await _send_error(send, error, self._request_id(scope))
            return
        await self._accept(scope, receive, send, entry, self._run_chat)

    async def _accept(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        entry: Script,
        run: Callable[[Scope, Send, Script, Any, _Request], Awaitable[None]],
    ) -> None:
        """Admission, body, deadline, trace, disconnect watch, error answer, bookkeeping."""
        started = time.perf_counter()
        asyncio_loop = self._asyncio
        if asyncio_loop is None:
            asyncio_loop = self._asyncio = sniffio.current_async_library() == "asyncio"
        request_scope = _AsyncioScope() if asyncio_loop else _Scope()
        request = _Request(self._request_id(scope).decode(), request_scope)
        trace = Trace(request.id, entry.name, self.metrics.span)
        root = trace.open(entry.name, 0, "script", entry.streaming)
        self.inflight += 1
        self._requests.add(request)
        try:
            if self.draining:
                raise HttpError(503, "draining", "the server is shutting down")
            if self.inflight > self.limits.max_inflight:
                raise HttpError(
                    429,
                    "overloaded",
                    f"the server is at its limit of {self.limits.max_inflight} requests in flight",
                    headers=[(b"retry-after", b"1")],
                )
            # The body arrives under its own, shorter deadline (and the request's): a
            # client that trickles it holds its admission slot no longer than that.
            timeout = self._timeout(scope)
            body_timeout = self.limits.body_timeout
            if timeout is not None:
                body_timeout = min(body_timeout, timeout)
            body = await self._body_within(scope, receive, body_timeout, asyncio_loop)
            try:
                req = entry.decode(body)
            except InvalidRequest as exc:
                raise _invalid(exc) from None
            # One cancel scope for the deadline, a disconnect and the end of a drain; the
            # deadline also travels with every remote call.
            deadline = None
            if timeout is not None:
                request.scope.expire_after(timeout)
                deadline = deadline_at(time.time() + timeout)
            token = activate(trace, root.id)
            stop_watching = _watch_disconnect(receive, request)
            try:
                async with request.scope:
                    await run(scope, _tracking(send, request), entry, req, request)
            finally:
                stop_watching()
                deactivate(token)
                reset_deadline(deadline)
            if request.disconnected:
                raise _Disconnected
            if request.scope.cancelled_caught:
                if request.shutdown:
                    self.metrics.cancelled("shutdown")
                    raise HttpError(
                        503, "draining", "the server shut down before the request ended"
                    )
                raise DeadlineExceeded(
                    f"request to {entry.name!r} exceeded its {timeout:g}s deadline"
                )
            trace.close(root, "ok")
        except _Disconnected:
            # Nobody to answer; 499 (client closed request) is for the log and metrics.
            # A stream whose headers went out as 200 is still a request the client
            # dropped: 499 in the log, the metrics and the timeline alike.
            request.disconnected = True
            request.status = 499
            trace.close(root, "cancelled", "disconnect")
            self.metrics.cancelled("disconnect")
        except BaseException as exc:
            error = error_for(exc)
            if error.status == 500 and not isinstance(exc, HttpError):
                log.error("request %s to %r failed", request.id, entry.name, exc_info=exc)
            if error.status == 504:
                self.metrics.cancelled("deadline")
            if not root.end:
                trace.close(root, *outcome_of(exc))
            await self._answer_error(send, request, error)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._requests.discard(request)
            self.inflight -= 1
            elapsed = time.perf_counter() - started
            trace.status = request.status
            self.traces.add(trace)
            if self.export is not None:
                try:
                    self.export(trace)
                except Exception:  # telemetry never fails a request
                    log.exception("could not export the trace of request %s", request.id)
            self.metrics.request(entry.name, request.status, elapsed)
            access.info(
                "%s %s %s %d %.1fms",
                request.id,
                scope["method"],
                scope["path"],
                request.status,
                elapsed * 1000,
            )
            if self._idle is not None and not self._requests:
                self._idle.set()

    async def _answer_error(self, send: Send, request: _Request, error: HttpError) -> None:
        if request.disconnected:
            return
        try:
            if request.streamed:
                # Headers went out already: end the stream with the error instead.
                await send({"type": "http.response.body", "body": request.error_frame(error)})
                request.status = request.status or error.status
            else:
                request.status = error.status
                await _send_error(send, error, request.id.encode())
        except OSError:
            request.disconnected = True

    async def _body_within(
        self, scope: Scope, receive: Receive, seconds: float, asyncio_loop: bool
    ) -> bytes:
        """:meth:`_body`, or 408 when it has not all arrived within ``seconds``."""
        try:
            if asyncio_loop:
                async with asyncio.timeout(seconds):
                    return await self._body(scope, receive)
            with anyio.fail_after(seconds):
                return await self._body(scope, receive)
        except TimeoutError:
            raise HttpError(
                408,
                "body_timeout",
                f"the request body did not arrive within {seconds:g}s",
                headers=[(b"connection", b"close")],
            ) from None

    async def _body(self, scope: Scope, receive: Receive) -> bytes:
        limit = self.limits.max_body_bytes
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise HttpError(
                413, "too_large", f"the body is {int(length)} bytes, over the {limit}-byte limit"
            )
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Disconnected
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise HttpError(413, "too_large", f"the body is over the {limit}-byte limit")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _timeout(self, scope: Scope) -> float | None:
        bound = self.limits.request_timeout
        raw = _header(scope, b"x-request-timeout")
        if raw is None:
            return bound
        try:
            seconds = float(raw)
        except ValueError:
            seconds = math.nan
        if not seconds > 0 or math.isinf(seconds):
            given = raw.decode(errors="replace")
            raise HttpError(
                400,
                "invalid_header",
                f"X-Request-Timeout must be a positive number of seconds, got {given!r}",
                path="X-Request-Timeout",
            )
        return seconds if bound is None else min(seconds, bound)

    async def _run_entry(
        self,
        scope: Scope,
        send: Send,
        entry: Script,
        req: Any,
        request: _Request,
    ) -> None:
        rid = request.id.encode()
        if not entry.streaming:
            result = await self.runtime.run(entry, req)
            request.status = 200
            await _respond(send, 200, _encode(result), rid)
            return
        ndjson = _NDJSON in (_header(scope, b"accept") or b"")
        if ndjson:
            frame = _ndjson_item
            end = b""
            request.error_frame = _ndjson_error
        else:
            frame = _sse_item
            end = b"event: end\ndata: {}\n\n"
        content_type = _NDJSON if ndjson else _SSE
        await self._stream(send, entry, req, request, content_type, frame)
        await send({"type": "http.response.body", "body": end})

    async def _stream(
        self,
        send: Send,
        entry: Script,
        req: Any,
        request: _Request,
        content_type: bytes,
        frame: Callable[[Any], bytes],
        opening: bytes = b"",
    ) -> None:
        """Run ``entry`` and send each item as the script yields it, from the script's
        own task (an item framed as ``b""`` is skipped). Headers, then ``opening``, wait
        for the first item, so an error before it still gets its own status code."""

        async def begin() -> None:
            await _start(send, 200, request.id.encode(), content_type, stream=True)
            request.streamed = True
            request.status = 200
            if opening:
                await send({"type": "http.response.body", "body": opening, "more_body": True})

        async def sink(item: Any) -> None:
            body = frame(item)
            if body:
                if not request.streamed:
                    await begin()
                await send({"type": "http.response.body", "body": body, "more_body": True})

        if entry.streaming:
            await self.runtime.feed(entry, req, sink)
        else:  # a unary chat entry: its answer is the one item
            await sink(await self.runtime.run(entry, req))
        if not request.streamed:  # an empty stream: headers, then the end
            await begin()

    async def _run_chat(
        self,
        scope: Scope,
        send: Send,
        entry: Script,
        req: Any,
        request: _Request,
    ) -> None:
        problem = chat.unsupported(req)
        if problem is not None:
            raise HttpError(400, "unsupported", problem[0], stage=entry.name, path=problem[1])
        cid = chat.completion_id()
        model = getattr(req, "model", "") or entry.model or entry.name
        tally = chat.Tally()
        if not getattr(req, "stream", False):
            if entry.streaming:
                parts: list[str] = []

                async def collect(item: Any) -> None:
                    parts.append(tally.add(item)[0])

                await self.runtime.feed(entry, req, collect)
                text = "".join(parts)
            else:
                text = tally.add(await self.runtime.run(entry, req))[0]
            request.status = 200
            body = chat.completion(cid, model, text, tally)
            await _respond(send, 200, body, request.id.encode())
            return

        chunks = chat.Chunks(cid, model)

        def frame(item: Any) -> bytes:
            text, finish = tally.add(item)
            if text:
                return chunks.text(text, finish)
            return chunks.finish(finish) if finish is not None else b""

        request.error_frame = _data_error
        await self._stream(send, entry, req, request, _SSE, frame, chunks.role())
        last = b"" if tally.finish_reason else chunks.finish("stop")
        usage = tally.usage()
        options = getattr(req, "stream_options", None) or {}
        if usage is not None and options.get("include_usage"):
            last += chunks.usage(usage)
        await send({"type": "http.response.body", "body": last + chunks.done()})

    # -- drain ------------------------------------------------------------------------

    async def drain(self, grace: float) -> bool:
        """Refuse new requests (``/ready`` turns 503), let in-flight ones finish for up to
        ``grace`` s, then cancel the rest (they are answered 503). True if none was cut."""
        self.draining = True
        with anyio.move_on_after(grace):
            while self._requests:
                self._idle = anyio.Event()
                await self._idle.wait()
            return True
        for request in list(self._requests):
            request.shutdown = True
            request.scope.cancel()
        with anyio.move_on_after(5):
            while self._requests:
                self._idle = anyio.Event()
                await self._idle.wait()
        return False


def _sse_item(item: Any) -> bytes:
    return b"data: " + _encode(item) + b"\n\n"


def _ndjson_item(item: Any) -> bytes:
    return _encode(item) + b"\n"


def _sse_error(error: HttpError) -> bytes:
    return b"event: error\ndata: " + error.body() + b"\n\n"


def _ndjson_error(error: HttpError) -> bytes:
    return error.body() + b"\n"


def _data_error(error: HttpError) -> bytes:
    # OpenAI-style streams carry errors as a data event (clients read error.message).
    return b"data: " + error.body() + b"\n\n"


async def _start(
    send: Send,
    status: int,
    request_id: bytes,
    content_type: bytes,
    *,
    length: int | None = None,
    stream: bool = False,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = [(b"content-type", content_type), (b"x-request-id", request_id)]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    if stream:
        headers.append((b"cache-control", b"no-cache"))
        headers.append((b"x-accel-buffering", b"no"))
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})


async def _respond(
    send: Send,
    status: int,
    body: bytes,
    request_id: bytes,
    content_type: bytes = _JSON,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    await _start(send, status, request_id, content_type, length=len(body), extra=extra)
    await send({"type": "http.response.body", "body": body})


async def _send_error(send: Send, error: HttpError, request_id: bytes) -> None:
    await _respond(send, error.status, error.body(), request_id, extra=error.headers)


async def _lifespan(receive: Receive, send: Send) -> None:
    """The runtime is set up before the server starts: lifespan only acknowledges."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
