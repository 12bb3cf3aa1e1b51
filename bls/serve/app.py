"""The ASGI application of ``bls serve``: the routes over a loaded script, and one
request's life from admission to its line in the log (reading its body is
:mod:`.intake`'s, running its entry and sending the answer :mod:`.answers`', the bytes
:mod:`.framing`'s).

Routes (:data:`Frontend.routes`; a known path asked with another method is 405; the
``GET`` ones are :mod:`.status`'s)::

    POST /v1/scripts/{entry}      run an entry (JSON in; JSON, SSE or NDJSON out)
    POST /v1/chat/completions     OpenAI-compatible, for an entry declared openai="chat"
    GET  /v1/models               the chat model(s) served (OpenAI's list shape)
    GET  /v1/scripts              entries with their request/response schemas
    GET  /openapi.json            generated from the message types
    GET  /health                  the process is alive
    GET  /ready                   every stage it calls is reachable (503 names those not)
    GET  /metrics                 Prometheus text
    GET  /debug/requests[/{id}]   recent requests and their stage timelines
    GET  /v1/runs[/{id}[/events]] background runs (``Prefer: respond-async``: :mod:`.runs`;
    DELETE /v1/runs/{id}          the routes: :mod:`.run_routes`)
    /v1/files, /v1/batches        OpenAI's Batch API for the chat entry (:mod:`.files`,
                                  :mod:`.batches`)

Each accepted request runs its script under one cancel scope. That scope ends it when
the client disconnects, when the request's deadline passes, when its body is too slow,
or when a drain runs out of grace, and with it every stage call under the request,
remote work included; its reason says what the client is told (:func:`.framing.cut_short`). Errors
reach the client as ``{"error": {"type", "message", "stage", "path", ...}}`` with a status
that says whose fault it was; a traceback never does (it goes to the log).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

import anyio
import msgspec

from ..config import AdmissionConfig
from ..console import loggable
from ..entry import Script
from ..errors import InvalidRequest
from ..journal import JournalError
from ..lifecycle import Drain
from ..loop import backend
from ..record_writer import RecordWriter
from ..runtime import Runtime
from ..scope import Reason
from ..tracing import Trace, TraceStore, outcome_of
from .admission import Admission, Ticket
from .answers import answer_entry
from .batches import Batches
from .chat_answers import answer_chat
from .cors import Cors
from .files import Files
from .framing import (
    HttpError,
    Receive,
    Scope,
    Send,
    cut_short,
    error_for,
    respond,
    send_error,
    store_unavailable,
)
from .intake import (
    Clocks,
    Disconnected,
    Headers,
    Limits,
    Phase,
    Request,
    invalid,
    read_body,
    request_id,
    request_id_of,
    request_timeout,
    wait_for_slot,
)
from .metrics import Metrics
from .routing import Route, Router
from .run_routes import RunRoutes, run_body
from .runs import Runs, wants_async
from .status import StatusRoutes

__all__ = ["Frontend"]

log = logging.getLogger("bls.http")
access = logging.getLogger("bls.access")
_encode = msgspec.json.encode

# What runs an accepted request's entry: (scope, send, entry, decoded request, request).
# How an accepted request is answered: its entry, its decoded body and the body's bytes.
Run = Callable[[Scope, Send, Script, Any, Request, bytes], Awaitable[None]]


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
        records: RecordWriter | None = None,
        admission: AdmissionConfig | None = None,
        runs: Runs | None = None,
        cors: Cors | None = None,
    ) -> None:
        self.entries = entries
        self.cors = cors  # the origins whose pages may call (bls serve --cors-origin)
        self.runs = runs  # background runs (None: Prefer: respond-async is not offered)
        self.records = records  # each request's record goes here (bls serve --record)
        self.runtime = runtime
        self.title = title
        self.limits = limits or Limits()
        # Who runs, who waits (priority, tenants), who gets 429: [admission] in bls.toml.
        admission = admission or AdmissionConfig()
        self.admission = Admission(self.limits.max_inflight, admission, entries)
        self.metrics = Metrics(lambda: self.inflight, lambda: self.admission.queued)
        self.metrics.watch_bindings(runtime.bindings)
        if runs is not None:
            self.metrics.watch_runs(runs)
        if records is not None:
            self.metrics.watch_records(records)
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
        # The requests' timings, on the event loop (bls.loop) of the first request.
        self._clocks: Clocks | None = None
        status = StatusRoutes(self)
        self.routes = [
            Route("/v1/scripts/", ["POST"], self._script, prefix=True),
            Route("/v1/chat/completions", ["POST"], self._chat),
            *status.routes,
            *(RunRoutes(runs).routes if runs is not None else ()),
        ]
        if runs is not None and self.chat_entry is not None:
            self.routes += Files(runs.journal, runs.config).routes
            self.routes += Batches(runs, runtime, self.chat_entry, self.models).routes
        self._router = Router(self.routes)
        self._answer_entry: Run = partial(answer_entry, runtime)

    # -- ASGI -------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            if self.cors is not None:
                cors_send = await self.cors.route(scope, send)
                if cors_send is None:
                    return  # (a preflight, answered)
                send = cors_send
            try:
                handler, rest = self._router.match(scope["method"], scope["path"])
            except HttpError as error:
                await _refuse(scope, send, error)
                return
            try:
                await handler(scope, receive, send, rest)
            except HttpError as error:  # (before its answer began: a large one refused)
                await _refuse(scope, send, error)
            except JournalError as exc:  # (a route of runs, files or batches: the store)
                log.error("%s %s: %s", scope["method"], loggable(scope["path"]), exc)
                with contextlib.suppress(Exception):  # (unless its answer had begun)
                    await _refuse(scope, send, store_unavailable(exc))
        elif kind == "lifespan":
            await _lifespan(receive, send)

    def chat_models(self) -> list[str]:
        """The names the chat route answers to: the entry's model, ``--model-alias``, and
        the models its stages' engines serve (their directories, as ``vllm serve`` does;
        a remote engine's once its worker answered)."""
        if self.chat_entry is None:
            return []
        served = (n for b in self.runtime.bindings.values() for n in b.models())
        return list(dict.fromkeys([*self.models, *served]))

    # -- the routes that run entries -------------------------------------------------

    async def _script(self, scope: Scope, receive: Receive, send: Send, name: str) -> None:
        entry = self.entries.get(name)
        if entry is None:
            why = f"no entry {name!r} (entries: {', '.join(self.entries)})"
            await _refuse(scope, send, HttpError(404, "not_found", why))
            return
        run = self._answer_entry if self.runs is None else self._answer_or_submit
        await self._accept(scope, receive, send, entry, run)

    async def _answer_or_submit(
        self, scope: Scope, send: Send, entry: Script, req: Any, request: Request, body: bytes
    ) -> None:
        """The answer; or, asked ``Prefer: respond-async`` (runs are kept), a run."""
        if wants_async(request.headers.prefer):
            await self._submit(scope, send, entry, req, request, body)
        else:
            await self._answer_entry(scope, send, entry, req, request, body)

    async def _submit(
        self, scope: Scope, send: Send, entry: Script, req: Any, request: Request, body: bytes
    ) -> None:
        """``Prefer: respond-async``: the run is made (and journaled) and answered 202;
        it goes on without this request (:mod:`.runs`). Its deadline is its own."""
        assert self.runs is not None
        timeout = request_timeout(request.headers, None)
        try:
            row = await self.runs.submit(entry, body, request.scope.ctx.priority, timeout)
        except JournalError as exc:  # (not the script's failure: the run was not made)
            log.error("%s: %s", entry.name, exc)
            raise store_unavailable(exc, entry.name) from None
        extra = [
            (b"location", b"/v1/runs/" + row.id.encode()),
            (b"preference-applied", b"respond-async"),
        ]
        request.reply.status = 202
        request.reply.finishing = True
        await respond(scope, send, 202, run_body(row), request.id.encode(), extra=extra)

    async def _chat(self, scope: Scope, receive: Receive, send: Send, _: str) -> None:
        if self.chat_entry is None:
            why = "no entry serves chat: declare one with @bls.script(openai='chat')"
            await _refuse(scope, send, HttpError(404, "not_found", why))
            return
        await self._accept(scope, receive, send, self.chat_entry, self._run_chat)

    async def _run_chat(
        self, scope: Scope, send: Send, entry: Script, req: Any, request: Request, body: bytes
    ) -> None:
        models = self.chat_models()
        await answer_chat(self.runtime, models, scope, send, entry, req, request, body)

    # -- one request's life: admit, read and run, answer, record ----------------------

    async def _accept(
        self, scope: Scope, receive: Receive, send: Send, entry: Script, run: Run
    ) -> None:
        headers = Headers(scope)
        started = time.perf_counter()
        try:
            timeout = request_timeout(headers, self.limits.request_timeout)
            ticket, priority = self._enter(scope, entry, headers)
        except HttpError as error:
            await self._refused(scope, send, entry, headers, error, started)
            return
        request = self._admit(scope, receive, entry, headers, started, timeout, priority)
        try:
            await self._read_and_run(scope, send, entry, run, request, ticket)
            request.trace.close(request.root, "ok")
        except Disconnected:
            self._dropped(request)
        except BaseException as exc:
            await self._answer_error(scope, send, request, exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self.admission.leave(ticket)
            self._record(scope, request)

    def _enter(self, scope: Scope, entry: Script, headers: Headers) -> tuple[Ticket, int]:
        """The request's place (:mod:`.admission`) and priority; 503 while draining."""
        if self._drain.draining:
            raise HttpError(503, "draining", "the server is shutting down")
        return self.admission.admit(scope, entry.name, headers)

    async def _refused(
        self,
        scope: Scope,
        send: Send,
        entry: Script,
        headers: Headers,
        error: HttpError,
        started: float,
    ) -> None:
        """A request refused before it started: its answer, its count in /metrics and its
        line in the access log, and no more (under a flood, refusing must stay cheap)."""
        rid = request_id(headers.request_id)
        if error.entry is None:
            error.entry = entry.name
        try:
            await send_error(scope, send, error, rid)
        except OSError:
            pass  # the client has gone already
        self._counted(scope, rid.decode(), entry.name, error.status, started)

    def _counted(self, scope: Scope, rid: str, entry: str, status: int, started: float) -> None:
        """A request's answer in /metrics and its line in the access log."""
        elapsed = time.perf_counter() - started
        self.metrics.request(entry, status, elapsed)
        if access.isEnabledFor(logging.INFO):  # (--no-access-log: no work at all)
            path = loggable(scope["path"])
            access.info("%s %s %s %d %.1fms", rid, scope["method"], path, status, elapsed * 1000)

    def _admit(
        self,
        scope: Scope,
        receive: Receive,
        entry: Script,
        headers: Headers,
        started: float,
        timeout: float | None,
        priority: int,
    ) -> Request:
        """The request's id, trace and scope (its deadline ``timeout`` s away, its calls
        at ``priority``); it counts as in flight from here."""
        rid = request_id(headers.request_id).decode()
        trace = Trace(rid, entry.name, self.metrics.span)
        clocks = self._clocks
        if clocks is None:  # the first request: the loop it runs on serves them all
            clocks = self._clocks = Clocks(backend(), self.limits)
        root = trace.open(entry.name, 0, "script", entry.streaming)
        recorder = self.records.recorder() if self.records is not None else None
        request = Request(
            request_id=rid,
            entry=entry.name,
            trace=trace,
            root=root,
            backend=clocks.backend,
            headers=headers,
            started=started,
            receive=receive,
            record=recorder,
            timeout=timeout,
            priority=priority,
        )
        clocks.start(request)
        self.inflight += 1
        self._requests.add(request)
        return request

    async def _read_and_run(
        self,
        scope: Scope,
        send: Send,
        entry: Script,
        run: Run,
        request: Request,
        ticket: Ticket,
    ) -> None:
        """Wait for a slot if the request queued, read the body, decode it, run the
        entry: under one cancel scope with the request's deadline, which every remote call
        carries (time spent waiting counts against it); a body slower than the server's
        bound, a disconnect and the end of a drain cancel it too (:class:`.intake.Clocks`)."""
        clocks = self._clocks
        assert clocks is not None  # (made with the first request)
        ran = False  # whether the entry ran to its end (else the scope's cancel ended it)
        try:
            async with request.scope:
                early = None
                if not ticket.granted:
                    clocks.queue(request)
                    early = await wait_for_slot(scope, request, ticket.wait)
                    clocks.granted(request)
                body = await read_body(scope, request, self.limits.max_body_bytes, early)
                clocks.read(request)
                try:
                    req = entry.decode(body)
                except InvalidRequest as exc:
                    raise invalid(exc) from None
                await run(scope, send, entry, req, request, body)
                ran = True
        finally:
            clocks.done(request)
        if request.gone:
            raise Disconnected
        if not ran:
            raise self._cut_short(request, clocks.body_timeout)

    def _cut_short(self, request: Request, body_timeout: float | None) -> Exception:
        """What answers a request its scope ended (:func:`.framing.cut_short`): a drain, a
        body too slow (bounded by the server's ``body_timeout``, or by its deadline when
        that comes first), its deadline."""
        reason = request.scope.reason
        if reason is Reason.DRAIN:
            self.metrics.cancelled("shutdown")
        timeout = request.timeout
        body_bound = body_timeout if request.body_bounded else timeout
        reading = request.phase is Phase.READING
        answer = cut_short(reason, reading, request.entry, timeout, body_bound)
        assert answer is not None  # (a client gone is raised as Disconnected before)
        return answer

    def _dropped(self, request: Request) -> None:
        """The client went away: nobody to answer. 499 (client closed request) is for the
        log, the metrics and the timeline, also for a stream whose 200 headers went out."""
        request.reply.status = 499
        request.trace.close(request.root, "cancelled", "disconnect")
        self.metrics.cancelled("disconnect")

    async def _answer_error(
        self, scope: Scope, send: Send, request: Request, exc: BaseException
    ) -> None:
        """The error's status and body; in the stream's own framing once it started."""
        error = error_for(exc, request.entry)
        if error.status == 500 and not isinstance(exc, HttpError):
            log.error("request %s to %r failed", request.id, request.entry, exc_info=exc)
        if error.status == 504:
            self.metrics.cancelled("deadline")
        if not request.root.end:
            request.trace.close(request.root, *outcome_of(exc))
        if request.gone:
            return
        reply = request.reply
        try:
            if reply.streamed:
                # Headers went out already: end the stream with the error instead.
                await send({"type": "http.response.body", "body": reply.error_frame(error)})
                reply.status = reply.status or error.status
            else:
                reply.status = error.status
                await send_error(scope, send, error, request.id.encode())
        except OSError:
            pass  # the client has gone

    def _record(self, scope: Scope, request: Request) -> None:
        """The request is over: its trace kept (and exported), metrics, the access log."""
        self._requests.discard(request)
        self.inflight -= 1
        trace = request.trace
        trace.status = request.reply.status
        self.traces.add(trace)
        if self.export is not None:
            try:
                self.export(trace)
            except Exception:  # telemetry never fails a request
                log.exception("could not export the trace of request %s", request.id)
        recorder = request.scope.ctx.record
        if recorder is not None and self.records is not None:
            self.records.write(request.id, recorder.finish())
        self._counted(scope, request.id, request.entry, request.reply.status, request.started)
        self._drain.left()

    # -- drain ------------------------------------------------------------------------

    async def drain(self, grace: float) -> bool:
        """Refuse new requests (``/ready`` turns 503), let in-flight ones finish for up to
        ``grace`` s, then cancel the rest (they are answered 503). True if none was cut."""

        def cancel_rest() -> None:
            for request in list(self._requests):
                request.scope.cancel(Reason.DRAIN)

        if self.runs is None:
            return await self._drain.drain(grace, cancel_rest)
        done: list[bool] = []
        async with anyio.create_task_group() as tg:  # requests and runs drain side by side

            async def drain_runs() -> None:
                assert self.runs is not None
                done.append(await self.runs.drain(grace))

            tg.start_soon(drain_runs)
            done.append(await self._drain.drain(grace, cancel_rest))
        return all(done)

    @property
    def draining(self) -> bool:
        return self._drain.draining


async def _refuse(scope: Scope, send: Send, error: HttpError) -> None:
    """Answer a request no route takes (404, 405), or that its route refused without
    answering (a large answer past the bound), with its line in the access log."""
    rid = request_id_of(scope)
    await send_error(scope, send, error, rid)
    path = loggable(scope["path"])
    access.info("%s %s %s %d", rid.decode(), scope["method"], path, error.status)


async def _lifespan(receive: Receive, send: Send) -> None:
    """The runtime is set up before the server starts: lifespan only acknowledges."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
