"""Answering Prometheus scrapes (``bls worker --metrics-port``) from one thread of its own.

The answer is computed apart from the event loop (the registry's collectors read counters
the loop keeps), so a scrape never waits on a call, nor a call on a scrape. Every
connection lives on one selector in that one thread, with bounds that hold whatever
clients do: a request's head of :data:`MAX_HEAD_BYTES` at most, :data:`TIMEOUT_S` for a
connection from its accept to its last byte, :data:`MAX_CONNECTIONS` open at once (past
that the oldest is closed to make room: a new scraper always gets in). A client that
connects and sends nothing holds a socket for a while, never a thread.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable

__all__ = ["MAX_CONNECTIONS", "MAX_HEAD_BYTES", "TIMEOUT_S", "ScrapeServer"]

log = logging.getLogger("bls.worker")

MAX_HEAD_BYTES = 8 * 1024
TIMEOUT_S = 5.0
MAX_CONNECTIONS = 64


class _Peer:
    __slots__ = ("head", "out", "sock", "started")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.started = time.monotonic()
        self.head = b""
        self.out = b""  # the answer, while it is being written


class ScrapeServer:
    """``GET`` (any path) answered with ``render()`` as ``content_type``; ``HEAD`` with
    its head; anything else 405. One request per connection (``Connection: close``).
    :meth:`start` binds and runs it in a daemon thread; :meth:`stop` ends it."""

    def __init__(
        self, render: Callable[[], bytes], content_type: str, host: str, port: int
    ) -> None:
        self._render = render
        self._type = content_type.encode()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, port))
        self._listener.listen(128)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._peers: dict[socket.socket, _Peer] = {}  # in the order they came
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="bls-metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """End the thread (bounded) and close every socket."""
        self._stopping = True
        self._wake_w.send(b"x")
        self._thread.join(5)

    # -- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        sel = self._selector
        sel.register(self._listener, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self._stopping:
                for key, events in sel.select(timeout=1.0):
                    sock = key.fileobj
                    if sock is self._listener:
                        self._accept()
                    elif sock is not self._wake_r:
                        self._serve(self._peers[sock], events)  # type: ignore[index]
                self._expire()
        except Exception:  # never take the worker down: its scrapes stop, its calls go on
            log.exception("the metrics server failed; /metrics is not served any more")
        finally:
            for peer in list(self._peers.values()):
                self._close(peer)
            sel.close()
            self._listener.close()
            self._wake_r.close()
            self._wake_w.close()

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, ConnectionError):
            return
        if len(self._peers) >= MAX_CONNECTIONS:
            self._close(next(iter(self._peers.values())))  # the oldest makes room
        sock.setblocking(False)
        self._peers[sock] = _Peer(sock)
        self._selector.register(sock, selectors.EVENT_READ)

    def _serve(self, peer: _Peer, events: int) -> None:
        try:
            if peer.out:
                self._write(peer)
                return
            chunk = peer.sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            self._close(peer)
            return
        if not chunk:
            self._close(peer)
            return
        peer.head += chunk
        end = peer.head.find(b"\r\n\r\n")
        if end < 0:
            end = peer.head.find(b"\n\n")
        if end < 0:
            if len(peer.head) > MAX_HEAD_BYTES:
                self._answer(peer, 431, b"Request Header Fields Too Large", b"")
            return
        method = peer.head.split(b" ", 1)[0]
        if method in (b"GET", b"HEAD"):
            body = self._render()
            self._answer(peer, 200, b"OK", body if method == b"GET" else b"", len(body))
        else:
            self._answer(peer, 405, b"Method Not Allowed", b"", extra=b"allow: GET, HEAD\r\n")

    def _answer(
        self,
        peer: _Peer,
        status: int,
        phrase: bytes,
        body: bytes,
        length: int | None = None,
        extra: bytes = b"",
    ) -> None:
        head = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n" % (
            status,
            phrase,
            self._type,
            len(body) if length is None else length,
        )
        peer.out = head + extra + b"connection: close\r\n\r\n" + body
        self._selector.modify(peer.sock, selectors.EVENT_WRITE)
        self._write(peer)

    def _write(self, peer: _Peer) -> None:
        try:
            sent = peer.sock.send(peer.out)
        except BlockingIOError:
            return
        except OSError:
            self._close(peer)
            return
        peer.out = peer.out[sent:]
        if not peer.out:
            self._close(peer)

    def _expire(self) -> None:
        """Close the connections older than :data:`TIMEOUT_S` (they are first in line)."""
        limit = time.monotonic() - TIMEOUT_S
        for peer in list(self._peers.values()):
            if peer.started > limit:
                break
            self._close(peer)

    def _close(self, peer: _Peer) -> None:
        self._peers.pop(peer.sock, None)
        try:
            self._selector.unregister(peer.sock)
        except (KeyError, ValueError):
            pass
        peer.sock.close()
