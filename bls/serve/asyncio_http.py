"""The HTTP/1.1 driver on asyncio, under Uvicorn's server.

Uvicorn's server accepts the sockets, owns the lifespan and the graceful shutdown, and
makes one :class:`AsyncioPeer` per connection (its ``http=`` setting): an asyncio
protocol whose calls push the bytes into the :class:`.peer.Peer` the trio driver shares,
and which answers each request in a task of its own. The rules are :mod:`.http11`'s;
what is asyncio's is here: pausing the transport's reading (past 64 KiB of unread body,
and while a pipelined request waits), waiting after a write while its write buffer is
full (``--send-timeout`` at most: then the connection is dropped), and a
connection's idle time (keep-alive) as one fixed delay on one shared timer
(:meth:`bls.loop.Backend.delays`): a dict insert and a delete per request where Uvicorn
makes and cancels a loop timer.
"""

from __future__ import annotations

import logging
from typing import Any

from ..loop import Delays, backend
from .exchange import Exchange
from .http11 import MAX_HEADER_BYTES, SEND_S, default_lines
from .peer import Peer

__all__ = ["AsyncioPeer", "connection_class"]

log = logging.getLogger("bls.http")


class AsyncioPeer(Peer):
    """One client connection: an asyncio protocol (Uvicorn makes one per accepted socket,
    with its config and server state)."""

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: Any = None,  # (Uvicorn's server passes it: ``loop`` is the loop)
        *,
        loop: Any,
        idle: Delays[AsyncioPeer],
        max_header_bytes: int = MAX_HEADER_BYTES,
        send_timeout: float = SEND_S,
    ) -> None:
        if not config.loaded:
            config.load()
        connection = {
            "server": None,
            "client": None,
            "scheme": "http",
            "root_path": config.root_path,
            "state": app_state,
        }
        super().__init__(config.loaded_app, connection, max_header_bytes)
        self.loop = loop
        self.server_state = server_state
        self.connections: set[Any] = server_state.connections
        self.tasks: set[Any] = server_state.tasks
        self.idle_timer = idle  # the connections waiting for their next request, on one timer
        self.send_timeout = send_timeout  # a client that takes no bytes this long is dropped
        self.transport: Any = None
        self.read_paused = False
        self.write_paused = False
        self.writable: Any = None  # a future while writing waits for the buffer
        # The server's default headers (Uvicorn makes a new list as the date changes),
        # and their lines, checked and formatted once per list.
        self.defaults: Any = None
        self.defaults_head = b""

    # -- the transport's calls ---------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.connections.add(self)
        self.transport = transport
        self.connection["server"] = _address(transport, "sockname")
        self.connection["client"] = _address(transport, "peername")
        if transport.get_extra_info("sslcontext"):
            self.connection["scheme"] = "https"

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        self.idle_timer.discard(self)
        self.lost()
        self.resume_writing()
        if exc is None:
            self.transport.close()

    def eof_received(self) -> None:
        pass  # (the transport closes)

    def data_received(self, data: bytes) -> None:
        self.idle_timer.discard(self)
        refused = self.received(data)
        if refused:
            log.warning("request from %s refused: %s", self.connection["client"], _why(refused))
            self.transport.write(refused)
            self.transport.close()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        writable, self.writable = self.writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    # -- the exchanges' calls (.exchange.Link) -----------------------------------------------

    def start(self, exchange: Exchange) -> None:
        task = self.loop.create_task(exchange.run(self.app))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    async def write(self, data: bytes) -> None:
        """``data`` handed to the transport; then, while its buffer is past its high-water
        mark, until the client has taken it (``send_timeout`` at most: then the connection
        is dropped, the buffer with it), so that an answer is held by its sender, and
        bounded there, not piled up in buffers."""
        transport = self.transport
        if transport.is_closing():
            return
        transport.write(data)
        if not self.write_paused:
            return
        writable = self.writable
        if writable is None or writable.done():  # (one whose waiter was cancelled is done)
            writable = self.writable = self.loop.create_future()
        timer = self.loop.call_later(self.send_timeout, self._too_slow)
        try:
            await writable  # (dropping the connection resumes it: connection_lost)
        finally:
            timer.cancel()

    def _too_slow(self) -> None:
        client, waited = self.connection["client"], self.send_timeout
        log.info("%s took none of an answer for %gs: closed", client, waited)
        self.transport.abort()

    async def more(self, exchange: Exchange) -> None:
        self.resume_reading()
        await exchange.woken()

    def answered(self, exchange: Exchange) -> None:
        """An answer is complete: start the next pipelined request, or wait for one for the
        keep-alive time (a refusal that waited for the answer goes out now)."""
        self.server_state.total_requests += 1
        if self.refused:
            self.transport.write(self.refused)
            self.transport.close()
        if self.transport.is_closing():
            return
        following = self.next_exchange()
        if following is not None:
            self.start(following)
        else:
            self.idle_timer.add(self)

    def close(self) -> None:
        self.transport.close()

    def pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()

    def default_head(self) -> bytes:
        defaults = self.server_state.default_headers
        if defaults is not self.defaults:
            self.defaults_head = default_lines(defaults)
            self.defaults = defaults
        return self.defaults_head

    # -- Uvicorn's server's calls ------------------------------------------------------------

    def close_idle(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()


def _address(transport: Any, which: str) -> tuple[str, int] | None:
    info = transport.get_extra_info(which)
    if isinstance(info, (list, tuple)) and len(info) >= 2:
        return (str(info[0]), int(info[1]))
    return None


def _why(refused: bytes) -> str:
    return refused.rpartition(b"\r\n\r\n")[2].decode(errors="replace")


def connection_class(
    keep_alive: float,
    loop: Any,
    max_header_bytes: int = MAX_HEADER_BYTES,
    send_timeout: float = SEND_S,
) -> Any:
    """What Uvicorn's ``http=`` takes: makes an :class:`AsyncioPeer` on ``loop`` whose
    idle time is ``keep_alive`` seconds, sharing one timer with the loop's others, whose
    requests' headers are bounded by ``max_header_bytes``, and whose client is dropped
    when it takes none of an answer for ``send_timeout`` seconds."""
    idle: Delays[AsyncioPeer] = backend().delays(keep_alive, AsyncioPeer.close_idle)

    def connection(*args: Any, **kwargs: Any) -> AsyncioPeer:
        kwargs.update(max_header_bytes=max_header_bytes, send_timeout=send_timeout)
        return AsyncioPeer(*args, loop=loop, idle=idle, **kwargs)

    return connection
