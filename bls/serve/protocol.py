"""The HTTP/1.1 connection ``bls serve`` runs on asyncio: Uvicorn's httptools protocol,
with its keep-alive timer moved onto a shared one.

Uvicorn arms a loop timer for each connection after each response (to close it if no
request follows within the keep-alive time) and cancels it when the next request
arrives: on uvloop, a timer made and torn down per request. Here every connection's idle
time is one fixed delay on one shared timer (:meth:`bls.loop.Backend.delays`): a dict
insert and a delete per request. Everything else (parsing, flow control, pipelining,
``100 Continue``, shutdown) is Uvicorn's own.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ..loop import Delays, backend

__all__ = ["Connection"]


class Connection(HttpToolsProtocol):
    """One client connection (Uvicorn makes one per accepted socket)."""

    def __init__(self, *args: Any, idle: Delays[Connection], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._idle = idle  # the connections waiting for their next request, on one timer

    def on_response_complete(self) -> None:
        # Uvicorn's, with the keep-alive timer on the shared delays.
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._idle.discard(self)
        self.flow.resume_reading()
        if self.pipeline:  # pipelined requests wait their turn
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self._idle.add(self)  # closed if no request comes within the keep-alive time

    def _unset_keepalive_if_required(self) -> None:
        self._idle.discard(self)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._idle.discard(self)


def _close_idle(connection: Connection) -> None:
    connection.timeout_keep_alive_handler()


def connection_class(keep_alive: float) -> Any:
    """What Uvicorn's ``http=`` takes: makes a :class:`Connection` whose idle time is
    ``keep_alive`` seconds, sharing one timer with the loop's other connections."""
    idle: Delays[Connection] = backend().delays(keep_alive, _close_idle)

    def connection(*args: Any, **kwargs: Any) -> Connection:
        return Connection(*args, idle=idle, **kwargs)

    return connection
