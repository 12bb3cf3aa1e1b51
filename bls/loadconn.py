"""One keep-alive HTTP/1.1 client connection of ``bls bench``, driven by a selector.

No event-loop library and no HTTP library: the load generator (:mod:`bls.loadgen`) runs
every connection from one ``selectors`` loop, and each connection here is a small state
machine: connect, TLS handshake (``https``), send the request, read the answer. At
thousands of requests a second a library's cost per request would be measured instead of
the server's; here a request costs one ``send`` and, for a short answer, one ``recv``.

An answer ends where HTTP/1.1 says: after its ``Content-Length``, at its last chunk, or
with the connection. A streamed answer (SSE or NDJSON) notes when its first item arrived.
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import ssl
import time

__all__ = ["Answer", "LoadConnection"]

READ = selectors.EVENT_READ
WRITE = selectors.EVENT_WRITE
STREAMS = (b"text/event-stream", b"application/x-ndjson")


class Answer:
    """One answer, parsed as its bytes arrive (:meth:`feed`)."""

    __slots__ = (
        "_buffer",
        "_chunked",
        "_length",
        "_to_end",
        "body",
        "first",
        "headers",
        "status",
        "stream",
        "t0",
    )

    def __init__(self, t0: float) -> None:
        self.t0 = t0  # when the request was sent (perf_counter)
        self.status = 0
        self.headers: dict[bytes, bytes] | None = None
        self.stream = False
        self.first: float | None = None  # a stream's first item, seconds after t0
        self.body = bytearray()
        self._buffer = bytearray()
        self._length: int | None = None
        self._chunked = False
        self._to_end = False

    def feed(self, data: bytes) -> bool:
        """Take the bytes that came in; whether the answer is whole."""
        self._buffer += data
        if self.headers is None and not self._head():
            return False
        if self._length is not None:
            if len(self._buffer) < self._length:
                return False
            self.body += self._buffer[: self._length]
            if self.stream and self.body:
                self.first = time.perf_counter() - self.t0
            return True
        if self._chunked:
            return self._chunks()
        return False  # it ends with the connection: :meth:`end`

    def end(self) -> bool:
        """The peer closed the connection: whether that completed the answer."""
        if self._to_end:
            self.body += self._buffer
            return True
        return False

    @property
    def keeps_alive(self) -> bool:
        return not self._to_end and (self.headers or {}).get(b"connection") != b"close"

    def _head(self) -> bool:
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            return False
        lines = bytes(self._buffer[:end]).split(b"\r\n")
        del self._buffer[: end + 4]
        version, _, rest = lines[0].partition(b" ")
        if not version.startswith(b"HTTP/1.") or not rest[:3].isdigit():
            raise ValueError(f"not an HTTP/1.1 answer: {lines[0][:80]!r}")
        self.status = int(rest[:3])
        headers = self.headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().lower()
        self.stream = headers.get(b"content-type", b"").startswith(STREAMS)
        if b"content-length" in headers:
            self._length = int(headers[b"content-length"])
        elif self.status in (204, 304) or self.status < 200:
            self._length = 0
        elif headers.get(b"transfer-encoding") == b"chunked":
            self._chunked = True
        else:
            self._to_end = True
        return True

    def _chunks(self) -> bool:
        buffer = self._buffer
        while True:
            line_end = buffer.find(b"\r\n")
            if line_end < 0:
                return False
            size = int(bytes(buffer[:line_end]).split(b";")[0], 16)
            start = line_end + 2
            if len(buffer) < start + size + 2:
                return False
            if size == 0:
                return True
            if self.first is None and self.stream:
                self.first = time.perf_counter() - self.t0
            self.body += buffer[start : start + size]
            del buffer[: start + size + 2]


class LoadConnection:
    """A connection that sends one request at a time and reads its answer.

    The load generator registers :attr:`sock` with its selector for :attr:`want` and calls
    :meth:`advance` on each event; it re-registers when ``want`` or the socket changed.
    Errors (refused, reset, an answer that does not parse) are raised from
    :meth:`start` and :meth:`advance` as ``OSError`` or ``ValueError``.
    """

    def __init__(
        self, address: tuple[object, ...], family: int, host: str, tls: ssl.SSLContext | None
    ) -> None:
        self.address, self.family, self.host, self.tls = address, family, host, tls
        self.sock: socket.socket | None = None
        self.want = WRITE
        self.answer: Answer | None = None
        self._out = b""
        self._state = "idle"  # connecting, handshake, sending, reading

    def start(self, request: bytes, t0: float) -> None:
        """Send ``request`` (connecting first when there is no connection)."""
        self._out = request
        self.answer = Answer(t0)
        if self.sock is None:
            self._connect()
        else:
            self._state = "sending"
            self._send()

    def advance(self) -> bool:
        """Go on after a selector event; whether the answer is now whole."""
        if self._state == "connecting":
            assert self.sock is not None
            error = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if error:
                raise OSError(error, os.strerror(error))  # ECONNREFUSED: ConnectionRefusedError
            self._connected()
        elif self._state == "handshake":
            self._handshake()
        elif self._state == "sending":
            self._send()
        if self._state != "reading":
            return False
        return self._read()

    def dropped(self) -> bool:
        """Whether the server closed this idle keep-alive connection, so that a request
        sent on it would fail (a peek finds its end). Not asked of a TLS connection."""
        if self.sock is None or self.tls is not None:
            return False
        try:
            return not self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except OSError:
            return True

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = None
        self._state = "idle"

    # -- the steps ---------------------------------------------------------------------

    def _connect(self) -> None:
        sock = socket.socket(self.family, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self._state = "connecting"
        self.want = WRITE
        error = sock.connect_ex(self.address)
        if error not in (0, errno.EINPROGRESS):  # else in progress: writable once connected
            raise OSError(error, os.strerror(error))

    def _connected(self) -> None:
        if self.tls is None:
            self._state = "sending"
            self._send()
            return
        assert self.sock is not None
        self.sock = self.tls.wrap_socket(
            self.sock, server_hostname=self.host, do_handshake_on_connect=False
        )
        self._state = "handshake"
        self._handshake()

    def _handshake(self) -> None:
        assert isinstance(self.sock, ssl.SSLSocket)
        try:
            self.sock.do_handshake()
        except ssl.SSLWantReadError:
            self.want = READ
            return
        except ssl.SSLWantWriteError:
            self.want = WRITE
            return
        self._state = "sending"
        self._send()

    def _send(self) -> None:
        assert self.sock is not None
        while self._out:
            try:
                sent = self.sock.send(self._out)
            except (BlockingIOError, ssl.SSLWantWriteError):
                self.want = WRITE
                return
            except ssl.SSLWantReadError:
                self.want = READ
                return
            self._out = self._out[sent:]
        self._state = "reading"
        self.want = READ

    def _read(self) -> bool:
        assert self.sock is not None and self.answer is not None
        try:
            data = self.sock.recv(65536)
            if self.tls is not None:
                while pending := self.sock.pending():  # type: ignore[attr-defined]
                    data += self.sock.recv(pending)
        except (BlockingIOError, ssl.SSLWantReadError):
            self.want = READ
            return False
        except ssl.SSLWantWriteError:
            self.want = WRITE
            return False
        if not data:
            if self.answer.end():
                self.close()
                return True
            raise ConnectionResetError("the server closed the connection before answering")
        if not self.answer.feed(data):
            return False
        self._state = "idle"
        if not self.answer.keeps_alive:
            self.close()
        return True
