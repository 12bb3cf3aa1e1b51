"""The HTTP/1.1 driver on trio: bls's own server when ``bls serve`` runs on trio.

It accepts on the listening socket ``bls serve`` made, and gives each connection one task
that answers its requests in line (:class:`TrioPeer`, on the :class:`.peer.Peer` the
asyncio driver shares): a task per request would cost trio about as much as the rest of
a small request. The bytes move on the plain non-blocking socket, waiting through trio
only when it would block (:func:`trio.lowlevel.wait_readable`, ``wait_writable``):
trio's socket streams add a checkpoint and a failed system call to every read and write,
a third of a small request's cost. Input is pulled, not pushed: the connection's task reads between
requests; while a request runs, whoever waits for input reads (its application reading
its body, the frontend's watch for its client leaving), one at a time. So reading stops
by itself while nobody asks (a body piling up, a pipelined request waiting), and a client
that leaves is heard by whoever is reading. While a pipelined request waits its turn,
what is read is kept unparsed (:data:`.http11.HIGH_WATER` bytes at most) until it is
that request's turn: reading goes on only to hear the client leave. A connection idle
for ``keep_alive`` seconds is closed. Stopping closes the idle connections, lets each
busy one finish its answer, and waits :data:`GRACEFUL_S` at most.
"""

from __future__ import annotations

import email.utils
import logging
import socket
import time
from typing import Any

import anyio
import anyio.abc
import trio

from .exchange import Exchange
from .http11 import HIGH_WATER, MAX_HEADER_BYTES, SEND_S
from .peer import Peer

__all__ = ["GRACEFUL_S", "TrioPeer", "serve"]

log = logging.getLogger("bls.http")

GRACEFUL_S = 5.0  # how long busy connections get to finish when the server stops
_RECEIVE = 65536  # bytes asked of the socket at a time


class _Clock:
    """The ``date`` line every answer carries, made once a second."""

    __slots__ = ("_line", "_second")

    def __init__(self) -> None:
        self._second = -1
        self._line = b""

    def line(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._line = b"date: %s\r\n" % email.utils.formatdate(now, usegmt=True).encode()
        return self._line


class TrioPeer(Peer):
    """One client connection, served by :meth:`serve` in its own task."""

    def __init__(
        self,
        app: Any,
        sock: socket.socket,
        connection: dict[str, Any],
        max_header_bytes: int,
        keep_alive: float,
        clock: _Clock,
        send_timeout: float = SEND_S,
    ) -> None:
        super().__init__(app, connection, max_header_bytes)
        self.sock = sock  # non-blocking
        self.keep_alive = keep_alive
        self.send_timeout = send_timeout
        self._clock = clock
        self.closed = False
        self.receiving = False  # a task is in the socket's receive (one at a time)
        self.unparsed = bytearray()  # read while a pipelined request waits its turn
        self._idle_wait: trio.CancelScope | None = None

    async def serve(self) -> None:
        """Answer the connection's requests in order until it closes (idle, refused, its
        client gone, or an answer that closes it)."""
        try:
            while not self.closed:
                if self.unparsed and not self.waiting:  # its turn has come
                    data = bytes(self.unparsed)
                    self.unparsed.clear()
                    await self._take(data)
                    continue
                exchange = self.current
                if exchange is None:
                    await self._read(idle=True)
                    continue
                await exchange.run(self.app)
                if self.current is exchange:  # not answered: its client left midway
                    break
                if self.refused:
                    await self._send(self.refused)
                    break
        finally:
            self.closed = True
            self.lost()
            trio.lowlevel.notify_closing(self.sock)  # (a task waiting on it hears it)
            self.sock.close()

    async def _read(self, idle: bool = False) -> None:
        """Read once and hand it to the requests; an end of input, a refusal (written) or
        ``keep_alive`` idle seconds close the connection."""
        self.receiving = True
        data = b""
        try:
            if idle:
                with trio.move_on_after(self.keep_alive) as self._idle_wait:
                    data = await self._receive()
            else:
                data = await self._receive()
        finally:
            self.receiving = False
            self._idle_wait = None
        if not data:
            self.lost()
            self.close()
            return
        if self.waiting or self.unparsed:  # a request waits its turn: keep this for then
            self.unparsed += data
            return
        await self._take(data)

    async def _take(self, data: bytes) -> None:
        """Hand ``data`` to the requests; a refusal is written and closes the connection."""
        refused = self.received(data)
        self._poke()
        if refused:
            log.warning("request from %s refused: %s", self.connection["client"], _why(refused))
            await self._send(refused)
            self.close()

    def _poke(self) -> None:
        """What came in may be what a waiting request wanted: let it look."""
        for exchange in (self.current, self.parsing):
            if exchange is not None:
                exchange.wake()

    async def _receive(self) -> bytes:
        """What the client sent next (b"": it is gone). Waits first: between requests
        nothing is there yet, and a read that finds nothing costs a system call."""
        sock = self.sock
        while True:
            try:
                await trio.lowlevel.wait_readable(sock)
                return sock.recv(_RECEIVE)
            except BlockingIOError:
                continue
            except (OSError, trio.ClosedResourceError):  # reset, or closed meanwhile
                return b""

    async def _send(self, data: bytes) -> None:
        """All of ``data``, waiting while the client does not read (``send_timeout`` at
        most each time: then it is disconnected); a client gone is heard as such."""
        sock = self.sock
        view = memoryview(data)
        try:
            while view:
                try:
                    view = view[sock.send(view) :]
                except BlockingIOError:
                    with trio.move_on_after(self.send_timeout) as waited:
                        await trio.lowlevel.wait_writable(sock)
                    if waited.cancelled_caught:
                        client, waited_s = self.connection["client"], self.send_timeout
                        log.info("%s took none of an answer for %gs: closed", client, waited_s)
                        raise ConnectionAbortedError from None
        except (OSError, trio.ClosedResourceError):
            self.lost()
            self.close()

    # -- the exchanges' calls (.exchange.Link) -----------------------------------------------

    def start(self, exchange: Exchange) -> None:
        pass  # (serve() runs the current request)

    async def write(self, data: bytes) -> None:
        if not self.closed:
            await self._send(data)

    async def more(self, exchange: Exchange) -> None:
        if not (self.receiving or self.closed or len(self.unparsed) >= HIGH_WATER):
            await self._read()
            return
        # Someone else reads (and wakes it), or what waits unparsed is enough for now.
        await exchange.woken()

    def answered(self, exchange: Exchange) -> None:
        if not self.closed:
            self.next_exchange()

    def close(self) -> None:
        self.closed = True
        if self._idle_wait is not None:
            self._idle_wait.cancel()

    def default_head(self) -> bytes:
        return self._clock.line()


def _why(refused: bytes) -> str:
    return refused.rpartition(b"\r\n\r\n")[2].decode(errors="replace")


async def serve(
    app: Any,
    sock: socket.socket,
    stop: anyio.Event,
    *,
    keep_alive: float = 30.0,
    max_header_bytes: int = MAX_HEADER_BYTES,
    send_timeout: float = SEND_S,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on the listening ``sock`` until ``stop`` is set; then stop accepting,
    close the idle connections, and give the busy ones :data:`GRACEFUL_S` to finish. A
    client that takes none of an answer for ``send_timeout`` s is disconnected."""
    sock.setblocking(False)
    peers: set[TrioPeer] = set()
    gone = trio.Event()  # set once stopping and the last connection has ended
    stopping = False
    clock = _Clock()
    server = _address(sock.getsockname())

    async def connection(conn: socket.socket, client: Any) -> None:
        info: dict[str, Any] = {
            "server": server,
            "client": _address(client),
            "scheme": "http",
            "root_path": "",
            "state": {},
        }
        peer = TrioPeer(app, conn, info, max_header_bytes, keep_alive, clock, send_timeout)
        peers.add(peer)
        try:
            await peer.serve()
        finally:
            peers.discard(peer)
            if stopping and not peers:
                gone.set()

    async with trio.open_nursery() as connections:
        async with trio.open_nursery() as accepting:
            accepting.start_soon(_accept, sock, connections, connection)
            task_status.started()
            await stop.wait()
            accepting.cancel_scope.cancel()
        stopping = True
        for peer in list(peers):
            peer.shutdown()
        if peers:
            with trio.move_on_after(GRACEFUL_S):
                await gone.wait()
        connections.cancel_scope.cancel()


async def _accept(sock: socket.socket, nursery: trio.Nursery, handler: Any) -> None:
    """Each connection ``sock`` takes, in a task of its own (non-blocking, no delay)."""
    while True:
        await trio.lowlevel.wait_readable(sock)
        while True:
            try:
                conn, client = sock.accept()
            except BlockingIOError:
                break
            except OSError as exc:  # out of file descriptors, say: the server lives on
                log.warning("accept failed: %s", exc)
                await trio.sleep(0.1)
                break
            conn.setblocking(False)
            if conn.family in (socket.AF_INET, socket.AF_INET6):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            nursery.start_soon(handler, conn, client)


def _address(info: Any) -> tuple[str, int] | None:
    if isinstance(info, (list, tuple)) and len(info) >= 2:
        return (str(info[0]), int(info[1]))
    return None
