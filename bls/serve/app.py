"""The ASGI application of ``bls serve``: routing over a loaded script, one request's
life from admission to its last byte (intake and framing live beside it).

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

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec

from ..entry import Script
from ..errors import DeadlineExceeded, InvalidRequest
from ..lifecycle import Drain
from ..runtime import Runtime
from ..scope import RequestScope
from ..tracing import Trace, TraceStore, outcome_of
from . import chat, openapi, pages
from .framing import (
    NDJSON,
    SSE,
    HttpError,
    Receive,
    Scope,
    Send,
    data_error,
    error_for,
    ndjson_error,
    ndjson_item,
    respond,
    send_error,
    sse_item,
    start,
)
from .intake import (
    Disconnected,
    Limits,
    Request,
    header,
    invalid,
    read_body,
    request_id,
    request_timeout,
    tracking,
    watch_disconnect,
)
from .metrics import CONTENT_TYPE as METRICS_TYPE
from .metrics import Metrics

__all__ = ["Frontend"]

log = logging.getLogger("bls.http")
access = logging.getLogger("bls.access")
_encode = msgspec.json.encode


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
        model_aliases: Sequence[str] = (),
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
        self._requests: set[Request] = set()
        self._drain = Drain(self._requests)
        self.chat_entry = next((e for e in entries.values() if e.openai == "chat"), None)
        # The model names the chat route answers to (GET /v1/models lists them).
        self.models: list[str] = []
        if self.chat_entry is not None:
            served = self.chat_entry.model or self.chat_entry.name
            self.models = list(dict.fromkeys([served, *model_aliases]))
        self._openapi: bytes | None = None
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
        await _refuse(scope, send, error)

    # -- small routes -----------------------------------------------------------------

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        await respond(send, 200, b'{"status":"ok"}', request_id(scope))

    async def _ready(self, scope: Scope, receive: Receive, send: Send) -> None:
        rid = request_id(scope)
        if self.draining:
            error = HttpError(503, "draining", "the server is shutting down")
            await send_error(send, error, rid)
            return
        down = [name for name, b in self.runtime.bindings.items() if not b.ready()]
        if down:
            error = HttpError(
                503,
                "stage_unavailable",
                f"stage(s) not reachable: {', '.join(down)}",
                stage=down[0],
            )
            await send_error(send, error, rid)
            return
        await respond(send, 200, _encode({"status": "ready"}), rid)

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = self.metrics.render()
        await respond(send, 200, body, request_id(scope), METRICS_TYPE.encode())

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
        await respond(send, 200, _encode({"scripts": listing}), request_id(scope))

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        await respond(send, 200, chat.models(self.models), request_id(scope))

    async def _openapi_json(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._openapi is None:
            self._openapi = _encode(openapi.document(self.entries, self.title))
        await respond(send, 200, self._openapi, request_id(scope))

    async def _debug_list(self, scope: Scope, receive: Receive, send: Send) -> None:
        rid = request_id(scope)
        if b"application/json" in (header(scope, b"accept") or b""):
            body = _encode([pages.summary(t) for t in self.traces.recent()])
            await respond(send, 200, body, rid)
            return
        page = pages.index_page(self.traces.recent(), self.title)
        await respond(send, 200, page.encode(), rid, b"text/html; charset=utf-8")

    async def _debug_page(self, scope: Scope, send: Send, trace_id: str) -> None:
        rid = request_id(scope)
        trace = self.traces.get(trace_id)
        if trace is None:
            error = HttpError(404, "not_found", f"no recent request with id {trace_id!r}")
            await send_error(send, error, rid)
            return
        if b"application/json" in (header(scope, b"accept") or b""):
            await respond(send, 200, _encode(pages.summary(trace, spans=True)), rid)
            return
        body = pages.trace_page(trace).encode()
        await respond(send, 200, body, rid, b"text/html; charset=utf-8")

    # -- running entries --------------------------------------------------------------

    async def _script(self, scope: Scope, receive: Receive, send: Send, name: str) -> None:
        entry = self.entries.get(name)
        if entry is None:
            error = HttpError(
                404,
                "not_found",
                f"no entry {name!r} (entries: {', '.join(self.entries)})",
            )
            await _refuse(scope, send, error)
            return
        await self._accept(scope, receive, send, entry, self._run_entry)

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        entry = self.chat_entry
        if entry is None:
            why = "no entry serves chat: declare one with @bls.script(openai='chat')"
            error = HttpError(404, "not_found", why)
            await send_error(send, error, request_id(scope))
            return
        await self._accept(scope, receive, send, entry, self._run_chat)

    async def _accept(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        entry: Script,
        run: Callable[[Scope, Send, Script, Any, Request], Awaitable[None]],
    ) -> None:
        """Admission, body, deadline, trace, disconnect watch, error answer, bookkeeping."""
        started = time.perf_counter()
        rid = request_id(scope).decode()
        trace = Trace(rid, entry.name, self.metrics.span)
        root = trace.open(entry.name, 0, "script", entry.streaming)
        request = Request(rid, RequestScope(rid, trace=trace, span=root))
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
            # One cancel scope for the request: first the body's own, shorter deadline
            # (a client that trickles its body holds its admission slot no longer than
            # that), then the request's deadline, which also travels with every remote
            # call; a disconnect and the end of a drain cancel it too.
            timeout = request_timeout(scope, self.limits.request_timeout)
            body_timeout = self.limits.body_timeout
            if body_timeout is None or (timeout is not None and timeout < body_timeout):
                body_timeout = timeout
            request.scope.expire_after(body_timeout)
            reading = True
            stop_watching = None
            try:
                async with request.scope:
                    body = await read_body(scope, receive, self.limits.max_body_bytes)
                    reading = False
                    request.scope.expire_after(timeout)  # now the request's own
                    try:
                        req = entry.decode(body)
                    except InvalidRequest as exc:
                        raise invalid(exc) from None
                    stop_watching = watch_disconnect(receive, request)
                    await run(scope, tracking(send, request), entry, req, request)
            finally:
                if stop_watching is not None:
                    stop_watching()
            if request.disconnected:
                raise Disconnected
            if request.scope.cancelled_caught:
                if request.shutdown:
                    self.metrics.cancelled("shutdown")
                    raise HttpError(
                        503, "draining", "the server shut down before the request ended"
                    )
                if reading:
                    raise HttpError(
                        408,
                        "body_timeout",
                        f"the request body did not arrive within {body_timeout:g}s",
                        headers=[(b"connection", b"close")],
                    )
                raise DeadlineExceeded(
                    f"request to {entry.name!r} exceeded its {timeout:g}s deadline"
                )
            trace.close(root, "ok")
        except Disconnected:
            # Nobody to answer; 499 (client closed request) is for the log and metrics.
            # A stream whose headers went out as 200 is still a request the client
            # dropped: 499 in the log, the metrics and the timeline alike.
            request.disconnected = True
            request.status = 499
            trace.close(root, "cancelled", "disconnect")
            self.metrics.cancelled("disconnect")
        except BaseException as exc:
            error = error_for(exc, entry.name)
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
            self._drain.left()

    async def _answer_error(self, send: Send, request: Request, error: HttpError) -> None:
        if request.disconnected:
            return
        try:
            if request.streamed:
                # Headers went out already: end the stream with the error instead.
                await send({"type": "http.response.body", "body": request.error_frame(error)})
                request.status = request.status or error.status
            else:
                request.status = error.status
                await send_error(send, error, request.id.encode())
        except OSError:
            request.disconnected = True

    async def _run_entry(
        self,
        scope: Scope,
        send: Send,
        entry: Script,
        req: Any,
        request: Request,
    ) -> None:
        rid = request.id.encode()
        if not entry.streaming:
            result = await self.runtime.run(entry, req)
            request.status = 200
            await respond(send, 200, _encode(result), rid)
            return
        ndjson = NDJSON in (header(scope, b"accept") or b"")
        if ndjson:
            frame = ndjson_item
            end = b""
            request.error_frame = ndjson_error
        else:
            frame = sse_item
            end = b"event: end\ndata: {}\n\n"
        content_type = NDJSON if ndjson else SSE
        await self._stream(send, entry, req, request, content_type, frame)
        await send({"type": "http.response.body", "body": end})

    async def _stream(
        self,
        send: Send,
        entry: Script,
        req: Any,
        request: Request,
        content_type: bytes,
        frame: Callable[[Any], bytes],
        opening: bytes = b"",
    ) -> None:
        """Run ``entry`` and send each item as the script yields it, from the script's
        own task (an item framed as ``b""`` is skipped). Headers, then ``opening``, wait
        for the first item, so an error before it still gets its own status code."""

        async def begin() -> None:
            await start(send, 200, request.id.encode(), content_type, stream=True)
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
        request: Request,
    ) -> None:
        problem = chat.unsupported(req)
        if problem is not None:
            raise HttpError(400, "unsupported", problem[0], path=problem[1])
        model = getattr(req, "model", "") or self.models[0]
        if model not in self.models:
            raise HttpError(
                404,
                "NotFoundError",  # as vllm serve answers, and the openai client expects
                f"The model `{model}` does not exist. Valid aliases: {', '.join(self.models)}.",
                path="$.model",
                param="model",
            )
        cid = chat.completion_id()
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
            await respond(send, 200, body, request.id.encode())
            return

        chunks = chat.Chunks(cid, model)

        def frame(item: Any) -> bytes:
            text, finish = tally.add(item)
            if text:
                return chunks.text(text, finish)
            return chunks.finish(finish) if finish is not None else b""

        request.error_frame = data_error
        await self._stream(send, entry, req, request, SSE, frame, chunks.role())
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

        def cancel_rest() -> None:
            for request in list(self._requests):
                request.shutdown = True
                request.scope.cancel()

        return await self._drain.drain(grace, cancel_rest)

    @property
    def draining(self) -> bool:
        return self._drain.draining


async def _refuse(scope: Scope, send: Send, error: HttpError) -> None:
    """Answer a request no route takes (404, 405), with its line in the access log."""
    rid = request_id(scope)
    await send_error(send, error, rid)
    access.info("%s %s %s %d", rid.decode(), scope["method"], scope["path"], error.status)


async def _lifespan(receive: Receive, send: Send) -> None:
    """The runtime is set up before the server starts: lifespan only acknowledges."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
