"""One request and its answer on an HTTP/1.1 connection (:mod:`.protocol`): the ASGI
``receive`` and ``send`` of the request's task.

It keeps what Uvicorn's httptools protocol does (``100 Continue`` when the application
first reads, writing that waits while the transport's buffer is full, chunked framing for
an answer without a length and none for HEAD, 204 and 304, ``500`` for an application
that fails before its answer went out and a close after), at a lower price per request:

- the body reaches the task without an ``asyncio.Event``: a request whose body came with
  its head (most) never waits, and one that waits has one future; such a body can be
  taken whole, with no message (the ``bls.request.body`` extension, :data:`.framing.BODY`);
- the answer's head is checked with one regular expression over its names and one over
  its values, not two per header;
- a head with a Content-Length waits for the first piece of its body, and the two go out
  in one write: one system call, one segment for the client to read;
- a whole answer may come in one message (the ``bls.response.whole`` extension each
  request's scope offers, :data:`.framing.WHOLE`), its head's lines formatted by the
  application: one message, and no header to parse or check, for the answers bls sends
  most. The default headers' lines are formatted, and checked, once per list.
"""

from __future__ import annotations

import http
import logging
import re
from collections.abc import Callable
from typing import Any, Protocol

from ..console import loggable
from .framing import BODY, WHOLE

__all__ = ["STATUS_LINES", "Exchange", "Link", "default_lines"]

log = logging.getLogger("bls.http")

# What a header's name (any separator or control character) and value (a control
# character other than tab) must not hold, as RFC 9110 says.
_BAD_NAME = re.compile(b'[\x00-\x1f\x7f()<>@,;:\\[\\]={} \t\\\\"]')
_BAD_VALUE = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]")


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %s\r\n" % (status, phrase)


STATUS_LINES = {status: _status_line(status) for status in range(100, 600)}


class Link(Protocol):
    """What an exchange needs of its connection (:class:`.protocol.Connection`)."""

    transport: Any  # the asyncio transport
    loop: Any  # the asyncio event loop
    write_paused: bool  # the transport's buffer is full

    def default_head(self) -> bytes:
        """The lines of the headers every answer carries (the server's default headers)."""

    def resume_reading(self) -> None: ...

    async def drain(self) -> None:
        """Wait until the transport takes writes again."""

    def answered(self) -> None:
        """The answer is complete."""


class Exchange:
    """One request and its answer: the ASGI ``receive`` and ``send`` of its task."""

    __slots__ = (
        "body",
        "chunked",
        "complete",
        "connection",
        "disconnected",
        "expect_continue",
        "head",
        "head_only",
        "keep_alive",
        "left",
        "more_body",
        "read",
        "scope",
        "started",
        "waiter",
    )

    def __init__(
        self, connection: Link, scope: dict[str, Any], keep_alive: bool, expect: bool
    ) -> None:
        self.connection = connection
        # The scope offers self.take (framing.BODY): held here only until the application
        # runs with it, then by its task alone (no cycle for the garbage collector).
        self.scope: dict[str, Any] | None = scope
        scope["extensions"] = {WHOLE: {}, BODY: {"take": self.take}}
        self.head_only = scope["method"] == "HEAD"
        self.keep_alive = keep_alive
        self.expect_continue = expect  # a 100 Continue is owed when the body is first read
        self.body = bytearray()
        self.more_body = True
        self.read = False  # the whole body went to the application
        self.waiter: Any = None  # a future while receive() waits for the body
        self.disconnected = False
        self.started = False  # the application started its answer (its head is out or held)
        self.complete = False  # its last byte went out
        self.chunked = False
        self.head = b""  # an answer's head that waits to go out with its body
        self.left = 0  # bytes of body the answer's content-length still owes

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def run(self, app: Callable[..., Any]) -> None:
        scope, self.scope = self.scope, None
        assert scope is not None  # (run once)
        try:
            await app(scope, self.receive, self.send)
        except BaseException as exc:
            log.error("%s: the application failed", _what(scope), exc_info=exc)
            await self._fail()
            if not isinstance(exc, Exception):
                raise
        else:
            if not self.complete and not self.disconnected:
                log.error(
                    "%s: the application returned before its answer was complete", _what(scope)
                )
                await self._fail()

    async def _fail(self) -> None:
        """End an answer the application did not finish: a 500 while nothing of it has
        gone out (a head held back for its body is dropped), else a close."""
        if self.head:
            self.head = b""
            self.started = self.chunked = False
            self.left = 0
        if self.started:
            self.connection.transport.close()
        else:
            await self._send_500()

    async def _send_500(self) -> None:
        body = b"Internal Server Error"
        await self.send(
            {
                "type": "http.response.start",
                "status": 500,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", b"%d" % len(body)),
                    (b"connection", b"close"),
                ],
            }
        )
        await self.send({"type": "http.response.body", "body": body})

    def take(self) -> bytes | None:
        """The whole body, if all of it is here and none was received (:data:`.framing.BODY`)."""
        if self.more_body or self.read or self.expect_continue or self.disconnected:
            return None
        self.read = True
        return bytes(self.body)

    async def receive(self) -> dict[str, Any]:
        connection = self.connection
        if self.expect_continue:
            self.expect_continue = False
            if not connection.transport.is_closing():
                connection.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        # Wait for more of the body, or (once it is all read) for the client to leave.
        while not (self.disconnected or self.complete) and (
            self.read or (self.more_body and not self.body)
        ):
            connection.resume_reading()
            self.waiter = waiter = connection.loop.create_future()
            try:
                await waiter
            finally:
                self.waiter = None
        if self.disconnected or self.complete:
            return {"type": "http.disconnect"}
        body = bytes(self.body)
        self.body.clear()
        more = self.more_body
        if more:
            connection.resume_reading()
        else:
            self.read = True
        return {"type": "http.request", "body": body, "more_body": more}

    async def send(self, message: dict[str, Any]) -> None:
        connection = self.connection
        if connection.write_paused and not self.disconnected:
            await connection.drain()
        if self.disconnected:
            return
        if not self.started:
            kind = message["type"]
            if kind == WHOLE:
                self._whole(message["status"], message["head"], message["body"])
            elif kind != "http.response.start":
                raise RuntimeError(f"expected 'http.response.start', got {kind!r}")
            else:
                self._head(message["status"], message.get("headers", ()))
        elif not self.complete:
            if message["type"] != "http.response.body":
                raise RuntimeError(f"expected 'http.response.body', got {message['type']!r}")
            self._body(message.get("body", b""), message.get("more_body", False))
        else:
            raise RuntimeError(f"{message['type']!r} sent after the answer was complete")

    def _head(self, status: int, headers: Any) -> None:
        self.started = True
        self.expect_continue = False
        head = [STATUS_LINES[status], self.connection.default_head()]
        names = []
        values = []
        length = None
        closing = False
        for name, value in headers:
            name = name.lower()
            names.append(name)
            values.append(value)
            if name == b"content-length" and length is None:
                length = int(value)
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.chunked = True
            elif name == b"connection" and b"close" in _tokens(value):
                self.keep_alive = False
                closing = True
            head.append(b"%s: %s\r\n" % (name, value))
        if _BAD_NAME.search(b"".join(names)):
            raise RuntimeError("invalid HTTP header name")
        if _BAD_VALUE.search(b"\t".join(values)):
            raise RuntimeError("invalid HTTP header value")
        if not self.keep_alive and not closing:
            head.append(b"connection: close\r\n")
        if self.chunked:
            length = None
        elif length is not None:
            self.left = length
        elif not self.head_only and status not in (204, 304):
            self.chunked = True
            head.append(b"transfer-encoding: chunked\r\n")
        head.append(b"\r\n")
        if length and not self.head_only:  # (its body follows: one write for both)
            self.head = b"".join(head)
        else:
            self.connection.transport.write(b"".join(head))

    def _body(self, body: bytes, more: bool) -> None:
        transport = self.connection.transport
        if self.head_only:
            self.left = 0
        elif self.chunked:
            if body:
                transport.write(
                    b"%x\r\n%s\r\n%s" % (len(body), body, b"" if more else b"0\r\n\r\n")
                )
            elif not more:
                transport.write(b"0\r\n\r\n")
        else:
            if len(body) > self.left:
                raise RuntimeError("the answer's body is longer than its content-length")
            self.left -= len(body)
            head = self.head
            if head:
                self.head = b""
                transport.write(head + body)
            else:
                transport.write(body)
        if not more:
            if self.left:
                raise RuntimeError("the answer's body is shorter than its content-length")
            self._complete()

    def _whole(self, status: int, head: bytes, body: bytes) -> None:
        """The whole answer (:data:`.framing.WHOLE`): its length, and a close when the
        connection will not be kept, added; one write."""
        if status < 200 or status in (204, 304):
            raise RuntimeError(f"a {status} answer has no body: send it as start and body")
        self.started = True
        self.expect_continue = False
        length = len(body)
        if self.head_only:
            body = b""
        close = b"" if self.keep_alive else b"connection: close\r\n"
        self.connection.transport.write(
            b"%s%s%scontent-length: %d\r\n%s\r\n%s"
            % (STATUS_LINES[status], self.connection.default_head(), head, length, close, body)
        )
        self._complete()

    def _complete(self) -> None:
        self.complete = True
        self.wake()
        if not self.keep_alive:
            self.connection.transport.close()
        self.connection.answered()


def _what(scope: dict[str, Any]) -> str:
    return f"{scope['method']} {loggable(scope['path'])}"


def default_lines(headers: Any) -> bytes:
    """The lines of a server's default headers (RuntimeError for a bad name or value)."""
    lines = []
    for name, value in headers:
        if _BAD_NAME.search(name) or _BAD_VALUE.search(value):
            raise RuntimeError(f"invalid default header {name!r}")
        lines.append(b"%s: %s\r\n" % (name.lower(), value))
    return b"".join(lines)


def _tokens(value: bytes) -> list[bytes]:
    return [token.strip() for token in value.lower().split(b",")]
