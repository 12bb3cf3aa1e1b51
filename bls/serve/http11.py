"""HTTP/1.1 without I/O, in h11's shape: a connection's bytes in, its requests' events out
(:class:`RequestParser`); an answer's parts in, its bytes out (:class:`Answer`). Nothing
here reads a socket, writes one or knows an event loop, so both drivers
(:mod:`.asyncio_http`, :mod:`.trio_http`) run the same rules, and the rules are tested
byte for byte without a socket (``tests/test_http11.py``).

Parsing is httptools' (llhttp), as in Uvicorn's own httptools protocol, whose behaviour
this keeps: a request asking to switch protocols is answered as HTTP/1.1 (no upgrade is
offered), what does not parse is a 400 and a close. Unlike Uvicorn it bounds a request's
head as h11 and nginx do: a URL over :data:`MAX_URL_BYTES` is a 414, headers over
``max_header_bytes`` a 431, refused before more of the head is buffered.

An answer is framed as its head says: a Content-Length, chunks when it gives none, no body
for HEAD, 204 and 304; a head with a length waits for the first piece of its body so that
the two go out in one write; a whole answer may come in one part, its head's lines
formatted by the application (the ``bls.response.whole`` extension).
"""

from __future__ import annotations

import http
import re
import urllib.parse
from collections.abc import Iterable

import httptools

__all__ = [
    "END",
    "HIGH_WATER",
    "MAX_HEADER_BYTES",
    "MAX_URL_BYTES",
    "SEND_S",
    "STATUS_LINES",
    "UPGRADE",
    "Answer",
    "Head",
    "Refusal",
    "RequestParser",
    "default_lines",
    "refusal",
]

HIGH_WATER = 65536  # unread body bytes past which a driver stops reading
MAX_URL_BYTES = 8 * 1024  # a longer request target gets 414 (nginx's line bound)
MAX_HEADER_BYTES = 16 * 1024  # headers (names, values) over this get 431 (h11's bound)
# A client that takes none of an answer's bytes for this long, its connection's buffer
# full, is disconnected and what waited for it dropped (nginx's send_timeout): an answer
# is held until its client took it, never longer.
SEND_S = 60.0
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

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


# -- requests: bytes in, events out ---------------------------------------------------------


class Head:
    """A request's head: ``method`` and ``version`` (str), ``path`` (percent-decoded),
    ``raw_path`` and ``query`` (bytes), ``headers`` (names in lower case, values without
    trailing white space), whether the connection may stay open after it
    (``keep_alive``) and whether its client waits for ``100 Continue`` before sending the
    body (``expect_continue``)."""

    __slots__ = (
        "expect_continue",
        "headers",
        "keep_alive",
        "method",
        "path",
        "query",
        "raw_path",
        "version",
    )

    def __init__(
        self,
        method: str,
        version: str,
        raw_path: bytes,
        query: bytes,
        headers: list[tuple[bytes, bytes]],
        keep_alive: bool,
        expect_continue: bool,
    ) -> None:
        self.method = method
        self.version = version
        self.raw_path = raw_path
        path = raw_path.decode("ascii")
        self.path = urllib.parse.unquote(path) if "%" in path else path
        self.query = query
        self.headers = headers
        self.keep_alive = keep_alive
        self.expect_continue = expect_continue


class Refusal:
    """The connection's input cannot be served: answer ``status`` with ``why`` (see
    :func:`refusal`) and close it."""

    __slots__ = ("status", "why")

    def __init__(self, status: int, why: str) -> None:
        self.status = status
        self.why = why


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


END = _Marker("END")  # the request's body is complete
UPGRADE = _Marker("UPGRADE")  # it asked to switch protocols: nothing after it is read

# What :meth:`RequestParser.feed` returns, in order: a Head, a piece of body (bytes), END,
# UPGRADE, or a Refusal (always last).
Event = Head | bytes | _Marker | Refusal


class _TooLarge(Exception):
    def __init__(self, refusal: Refusal) -> None:
        self.refusal = refusal


class RequestParser:
    """A connection's requests, from its bytes: :meth:`feed` returns the events the bytes
    completed. A request's head is bounded (module docstring): the URL as it arrives,
    the headers as each one completes, and the input read while the head is still
    incomplete (so that one header's endless value is refused as it grows)."""

    __slots__ = (
        "_began",
        "_events",
        "_expect",
        "_head_input",
        "_header_bytes",
        "_headers",
        "_in_head",
        "_max_header_bytes",
        "_parser",
        "_url",
    )

    def __init__(self, max_header_bytes: int = MAX_HEADER_BYTES) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self._parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self._max_header_bytes = max_header_bytes
        self._events: list[Event] = []
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._expect = False
        self._in_head = False
        self._began = False  # a request began in the input being parsed
        self._header_bytes = 0
        self._head_input = 0

    def feed(self, data: bytes) -> list[Event]:
        """The events ``data`` completes (a :class:`Refusal` ends them: feed no more)."""
        events = self._events = []
        self._began = False
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if not isinstance(exc.__context__, _TooLarge):
                raise
            events.append(exc.__context__.refusal)
        except httptools.HttpParserUpgrade:
            # No upgrade is offered (RFC 9110 lets a server ignore one): the request is
            # answered as HTTP/1.1, and the connection closes after it, since the parser
            # reads nothing more once a request asked to switch protocols.
            events.append(UPGRADE)
        except httptools.HttpParserError:
            events.append(Refusal(400, "Invalid HTTP request received."))
        else:
            if self._in_head and not self._began:  # (all of it, for a head begun before)
                self._head_input += len(data)
                if self._head_input > self._max_header_bytes + MAX_URL_BYTES:
                    events.append(self._too_many_header_bytes())
        return events

    def _too_many_header_bytes(self) -> Refusal:
        limit = self._max_header_bytes
        return Refusal(431, f"the request's headers are over the {limit}-byte limit")

    # -- the parser's calls -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._expect = False
        self._headers = []
        self._in_head = self._began = True
        self._header_bytes = self._head_input = 0

    def on_url(self, url: bytes) -> None:
        if len(self._url) + len(url) > MAX_URL_BYTES:
            why = f"the URL is over the {MAX_URL_BYTES}-byte limit"
            raise _TooLarge(Refusal(414, why))
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4  # (": " and the line's end)
        if self._header_bytes > self._max_header_bytes:
            raise _TooLarge(self._too_many_header_bytes())
        name = name.lower()
        value = value.rstrip(b" \t")  # (llhttp keeps trailing white space; RFC 9110 does not)
        if name == b"expect" and value.lower() == b"100-continue":
            self._expect = True
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._in_head = False
        parser = self._parser
        version = parser.get_http_version()
        url = httptools.parse_url(self._url)
        self._events.append(
            Head(
                parser.get_method().decode("ascii"),
                version,
                url.path,
                url.query or b"",
                self._headers,
                version != "1.0" and parser.should_keep_alive(),
                self._expect,
            )
        )

    def on_body(self, body: bytes) -> None:
        self._events.append(body)

    def on_message_complete(self) -> None:
        self._events.append(END)


def refusal(status: int, why: str, default_head: bytes = b"") -> bytes:
    """The whole answer to a connection whose input cannot be served: ``status``, ``why``
    as text, and a close."""
    message = why.encode()
    return b"".join(
        [
            STATUS_LINES[status],
            default_head,
            b"content-type: text/plain; charset=utf-8\r\n",
            b"content-length: %d\r\n" % len(message),
            b"connection: close\r\n\r\n",
            message,
        ]
    )


# -- answers: parts in, bytes out -----------------------------------------------------------


class Answer:
    """One request's answer, as bytes to write: :meth:`start` then :meth:`body` parts, or
    :meth:`whole`. Each returns what to write now (``b""``: nothing yet); a part out of
    order or a body that its length does not fit is a RuntimeError. ``default_head`` is
    the lines every answer carries (:func:`default_lines`)."""

    __slots__ = (
        "chunked",
        "complete",
        "default_head",
        "expect_continue",
        "head_only",
        "held",
        "keep_alive",
        "left",
        "started",
    )

    def __init__(
        self, head_only: bool, keep_alive: bool, expect_continue: bool, default_head: bytes
    ) -> None:
        self.head_only = head_only  # a HEAD request: no body goes out
        self.keep_alive = keep_alive  # the connection stays open after it
        self.expect_continue = expect_continue  # a 100 Continue is owed at the first read
        self.default_head = default_head
        self.started = False  # its head is out, or held for its body
        self.complete = False  # its last byte is out
        self.chunked = False
        self.held = b""  # a head that waits to go out with its body
        self.left = 0  # bytes of body its content-length still owes

    def continue_(self) -> bytes:
        """``100 Continue`` if the client waits for it and nothing has gone out; once."""
        if self.expect_continue:
            self.expect_continue = False
            if not self.started:
                return CONTINUE
        return b""

    def start(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> bytes:
        """The head (held back when it has a length and a body follows)."""
        if self.started:
            raise RuntimeError("the answer's head was sent already")
        self.started = True
        self.expect_continue = False
        head = [STATUS_LINES[status], self.default_head]
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
            self.held = b"".join(head)
            return b""
        return b"".join(head)

    def body(self, data: bytes, more: bool) -> bytes:
        """A piece of the body (the held head before it); the last one when not ``more``."""
        if not self.started:
            raise RuntimeError("the answer's body came before its head")
        if self.complete:
            raise RuntimeError("a body part came after the answer was complete")
        out = b""
        if self.head_only:
            self.left = 0
        elif self.chunked:
            if data:
                out = b"%x\r\n%s\r\n%s" % (len(data), data, b"" if more else b"0\r\n\r\n")
            elif not more:
                out = b"0\r\n\r\n"
        else:
            if len(data) > self.left:
                raise RuntimeError("the answer's body is longer than its content-length")
            self.left -= len(data)
            out = data
        if self.held:
            out, self.held = self.held + out, b""
        if not more:
            if self.left:
                raise RuntimeError("the answer's body is shorter than its content-length")
            self.complete = True
        return out

    def whole(self, status: int, head: bytes, body: bytes) -> bytes:
        """The whole answer in one part: its length, and a close when the connection will
        not be kept, added (``head``: its other lines, formatted)."""
        if self.started:
            raise RuntimeError("the answer's head was sent already")
        if status < 200 or status in (204, 304):
            raise RuntimeError(f"a {status} answer has no body: send it as start and body")
        self.started = self.complete = True
        self.expect_continue = False
        length = len(body)
        if self.head_only:
            body = b""
        close = b"" if self.keep_alive else b"connection: close\r\n"
        return b"%s%s%scontent-length: %d\r\n%s\r\n%s" % (
            STATUS_LINES[status],
            self.default_head,
            head,
            length,
            close,
            body,
        )

    def drop_held(self) -> bool:
        """Forget a head held back for a body that will not come; whether nothing of the
        answer has gone out (so another answer may be sent instead)."""
        if self.held:
            self.held = b""
            self.started = self.chunked = False
            self.left = 0
        return not self.started


def default_lines(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """The lines of a server's default headers (RuntimeError for a bad name or value)."""
    lines = []
    for name, value in headers:
        if _BAD_NAME.search(name) or _BAD_VALUE.search(value):
            raise RuntimeError(f"invalid default header {name!r}")
        lines.append(b"%s: %s\r\n" % (name.lower(), value))
    return b"".join(lines)


def _tokens(value: bytes) -> list[bytes]:
    return [token.strip() for token in value.lower().split(b",")]
