"""The routes that say how a frontend is, as opposed to those that run entries: its
liveness and readiness, its metrics, its entries and their schemas, its chat models, and
the timelines of its recent requests (:class:`StatusRoutes`)."""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from ..entry import Script
from ..tracing import TraceStore
from . import chat, openapi, pages
from .framing import HttpError, Receive, Scope, Send, respond, send_error
from .intake import header, request_id_of
from .metrics import CONTENT_TYPE as METRICS_TYPE
from .metrics import Metrics
from .routing import Route

__all__ = ["StatusRoutes"]

_encode = msgspec.json.encode


class Served(Protocol):
    """What the status routes read of their frontend (:class:`.app.Frontend`)."""

    entries: dict[str, Script]
    metrics: Metrics
    traces: TraceStore
    title: str
    runs: Any  # its background runs (None: not offered)

    @property
    def draining(self) -> bool: ...

    @property
    def runtime(self) -> Any: ...

    def chat_models(self) -> list[str]: ...


class StatusRoutes:
    """``GET`` routes over ``frontend`` (:data:`routes`): ``/health``, ``/ready``,
    ``/metrics``, ``/v1/scripts``, ``/v1/models``, ``/openapi.json``,
    ``/debug/requests[/ID]``."""

    def __init__(self, frontend: Served) -> None:
        self.frontend = frontend
        self._openapi: bytes | None = None  # made once, at its first request
        self.routes = [
            Route("/v1/models", ["GET"], self._models),
            Route("/v1/scripts", ["GET"], self._list),
            Route("/openapi.json", ["GET"], self._openapi_json),
            Route("/health", ["GET"], self._health),
            Route("/ready", ["GET"], self._ready),
            Route("/metrics", ["GET"], self._metrics),
            Route("/debug/requests", ["GET"], self._debug_list),
            Route("/debug/requests/", ["GET"], self._debug_page, prefix=True),
        ]

    async def _health(self, scope: Scope, receive: Receive, send: Send, _: str) -> None:
        await respond(scope, send, 200, b'{"status":"ok"}', request_id_of(scope))

    async def _ready(self, scope: Scope, receive: Receive, send: Send, _: str) -> None:
        rid = request_id_of(scope)
        if self.frontend.draining:
            error = HttpError(503, "draining", "the server is shutting down")
            await send_error(scope, send, error, rid)
            return
        down = [name for name, b in self.frontend.runtime.bindings.items() if not b.ready()]
        if down:
            error = HttpError(
                503,
                "stage_unavailable",
                f"stage(s) not reachable: {', '.join(down)}",
                stage=down[0],
            )
            await send_error(scope, send, error, rid)
            return
        await respond(scope, send, 200, _encode({"status": "ready"}), rid)

    async def _metrics(self, scope: Scope, receive: Receive, send: Send, _: str) -> None:
        body = self.frontend.metrics.render()
        await respond(scope, send, 200, body, request_id_of(scope), METRICS_TYPE.encode())

    async def _list(self, scope: Scope, receive: Receive, send: Send, _: str) -> None:
        listing = []
        for entry in self.frontend.entries.values():
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
        await respond(scope, send, 200, _encode({"scripts": listing}), request_id_of(scope))

    async def _models(self, scope: Scope, receive: Receive, send: Send, _: str) -> None:
        body = chat.models(self.frontend.chat_models())
        await respond(scope, send, 200, body, request_id_of(scope))

    async def _openapi_json(self, scope: Scope, receive: Receive, send: Send, _: str) -> None:
        if self._openapi is None:
            frontend = self.frontend
            runs = frontend.runs is not None
            self._openapi = _encode(openapi.document(frontend.entries, frontend.title, runs))
        await respond(scope, send, 200, self._openapi, request_id_of(scope))

    async def _debug_list(self, scope: Scope, receive: Receive, send: Send, _: str) -> None:
        rid = request_id_of(scope)
        if b"application/json" in (header(scope, b"accept") or b""):
            body = _encode([pages.summary(t) for t in self.frontend.traces.recent()])
            await respond(scope, send, 200, body, rid)
            return
        page = pages.index_page(self.frontend.traces.recent(), self.frontend.title)
        await respond(scope, send, 200, page.encode(), rid, b"text/html; charset=utf-8")

    async def _debug_page(self, scope: Scope, receive: Receive, send: Send, trace_id: str) -> None:
        rid = request_id_of(scope)
        trace = self.frontend.traces.get(trace_id)
        if trace is None:
            error = HttpError(404, "not_found", f"no recent request with id {trace_id!r}")
            await send_error(scope, send, error, rid)
            return
        if b"application/json" in (header(scope, b"accept") or b""):
            await respond(scope, send, 200, _encode(pages.summary(trace, spans=True)), rid)
            return
        body = pages.trace_page(trace).encode()
        await respond(scope, send, 200, body, rid, b"text/html; charset=utf-8")
