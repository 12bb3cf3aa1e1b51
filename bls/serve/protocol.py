"""The HTTP/1.1 connection ``bls serve`` runs on asyncio, under Uvicorn's server.

Uvicorn's server accepts the sockets, owns the lifespan and the graceful shutdown, and
makes one :class:`Connection` per connection (its ``http=`` setting); each request on it
is an :class:`.exchange.Exchange`. Parsing is httptools' (llhttp), as in Uvicorn's own
httptools protocol, whose behaviour this keeps: pipelined requests answered in order
(reading pauses while one waits), reading paused past 64 KiB of unread body, ``400`` and
a close for what does not parse, a graceful shutdown that lets the answer in flight end.
Unlike Uvicorn it bounds a request's head, as h11 and nginx do: a URL over
:data:`MAX_URL_BYTES` is answered ``414``, headers over ``max_header_bytes`` ``431``, and
the connection closed, before more of it is buffered.
A request asking to switch protocols is answered as HTTP/1.1 (no upgrade is offered) and
its connection closed after it; as with Uvicorn, a body sent with it is not read.

What differs is what a request costs, for a server whose whole request takes a few tens
of microseconds: a connection's idle time (keep-alive) is one fixed delay on one shared
timer (:meth:`bls.loop.Backend.delays`), a dict insert and a delete per request where
Uvicorn makes and cancels a loop timer; and the exchange's own savings (:mod:`.exchange`).
"""

from __future__ import annotations

import logging
import urllib.parse
from collections import deque
from typing import Any

import httptools

from ..loop import Delays, backend
from .exchange import STATUS_LINES, Exchange, default_lines

__all__ = ["MAX_HEADER_BYTES", "MAX_URL_BYTES", "Connection", "connection_class"]

log = logging.getLogger("bls.http")

_HIGH_WATER = 65536  # unread body bytes that pause reading
MAX_URL_BYTES = 8 * 1024  # a longer request target gets 414 (nginx's line bound)
MAX_HEADER_BYTES = 16 * 1024  # headers (names, values) over this get 431 (h11's bound)


class _HeadTooLarge(Exception):
    """A request's head is over a bound: its status and why."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status
        self.why = why


class Connection:
    """One client connection: an asyncio protocol (Uvicorn makes one per accepted
    socket, with its config and server state)."""

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: Any = None,  # (Uvicorn's server passes it: ``loop`` is the loop)
        *,
        loop: Any,
        idle: Delays[Connection],
        max_header_bytes: int = MAX_HEADER_BYTES,
    ) -> None:
        if not config.loaded:
            config.load()
        self.app = config.loaded_app
        self.loop = loop
        self.root_path: str = config.root_path
        self.app_state = app_state
        self.server_state = server_state
        self.connections: set[Any] = server_state.connections
        self.tasks: set[Any] = server_state.tasks
        self.idle = idle  # the connections waiting for their next request, on one timer
        self.parser = httptools.HttpRequestParser(self)
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self.transport: Any = None
        self.server: tuple[str, int] | None = None
        self.client: tuple[str, int] | None = None
        self.scheme = "http"
        self.read_paused = False
        self.write_paused = False
        self.writable: Any = None  # a future while writing waits for the buffer
        self.pipeline: deque[Exchange] = deque()  # requests waiting for the one answering
        self.exchange: Exchange | None = None  # the request parsed last
        self.answering: Exchange | None = None  # the one whose task runs (or ran last)
        # The server's default headers (Uvicorn makes a new list as the date changes),
        # and their lines, checked and formatted once per list.
        self.defaults: Any = None
        self.defaults_head = b""
        # The request being parsed, and how much of its head has come so far: what the
        # parser handed over (the URL, whole headers), and the bytes of input read
        # wholly inside the head (a header's value still arriving is in those alone).
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.expect_continue = False
        self.max_header_bytes = max_header_bytes
        self.in_head = False
        self.began = False  # a request began in the input being parsed
        self.header_bytes = 0
        self.head_input = 0

    # -- the transport's calls -----------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.connections.add(self)
        self.transport = transport
        self.server = _address(transport, "sockname")
        self.client = _address(transport, "peername")
        if transport.get_extra_info("sslcontext"):
            self.scheme = "https"

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        self.idle.discard(self)
        # The client is gone: the request being answered hears it (and so does a
        # pipelined one that waits behind it, if it ever starts).
        for exchange in (self.answering, self.exchange):
            if exchange is not None:
                if not exchange.complete:
                    exchange.disconnected = True
                exchange.wake()
        self.resume_writing()
        if exc is None:
            self.transport.close()
        self.parser = None  # type: ignore[assignment]

    def eof_received(self) -> None:
        pass  # (the transport closes)

    def data_received(self, data: bytes) -> None:
        self.idle.discard(self)
        self.began = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if not isinstance(exc.__context__, _HeadTooLarge):
                raise
            self._too_large(exc.__context__)
            return
        except httptools.HttpParserUpgrade:
            # No upgrade is offered (RFC 9110 lets a server ignore one): the request is
            # answered as HTTP/1.1, and the connection closes after it, since the parser
            # reads nothing more once a request asked to switch protocols.
            exchange = self.exchange
            if exchange is not None:
                exchange.keep_alive = False
                if exchange.complete:
                    self.transport.close()
        except httptools.HttpParserError:
            log.warning("invalid HTTP request from %s", self.client)
            self._reject(400, b"Invalid HTTP request received.")
            return
        if self.in_head and not self.began:  # (all of it, for a head begun before it)
            self.head_input += len(data)
            if self.head_input > self.max_header_bytes + MAX_URL_BYTES:
                self._too_large(self._head_bound())

    def _head_bound(self) -> _HeadTooLarge:
        limit = self.max_header_bytes
        return _HeadTooLarge(431, f"the request's headers are over the {limit}-byte limit")

    def _too_large(self, error: _HeadTooLarge) -> None:
        log.warning("request from %s refused: %s", self.client, error.why)
        self._reject(error.status, error.why.encode())

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        writable, self.writable = self.writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    # -- the parser's calls ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.url = b""
        self.expect_continue = False
        self.headers = []
        self.in_head = self.began = True
        self.header_bytes = self.head_input = 0

    def on_url(self, url: bytes) -> None:
        if len(self.url) + len(url) > MAX_URL_BYTES:
            raise _HeadTooLarge(414, f"the URL is over the {MAX_URL_BYTES}-byte limit")
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value) + 4  # (": " and the line's end)
        if self.header_bytes > self.max_header_bytes:
            raise self._head_bound()
        name = name.lower()
        value = value.rstrip(b" \t")  # (llhttp keeps trailing white space; RFC 9110 does not)
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.in_head = False
        parser = self.parser
        version = parser.get_http_version()
        url = httptools.parse_url(self.url)
        raw_path = url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        root = self.root_path
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": version,
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "root_path": root,
            "headers": self.headers,
            "state": self.app_state.copy(),
            "method": parser.get_method().decode("ascii"),
            "path": root + path if root else path,
            "raw_path": root.encode("ascii") + raw_path if root else raw_path,
            "query_string": url.query or b"",
        }
        keep_alive = version != "1.0" and parser.should_keep_alive()
        exchange = Exchange(self, scope, keep_alive, self.expect_continue)
        previous, self.exchange = self.exchange, exchange
        if previous is None or previous.complete:
            self._start(exchange)
        else:  # pipelined: it waits its turn, and nothing more is read meanwhile
            self.pause_reading()
            self.pipeline.appendleft(exchange)

    def on_body(self, body: bytes) -> None:
        exchange = self.exchange
        if exchange is None or exchange.complete:
            return
        exchange.body += body
        if len(exchange.body) > _HIGH_WATER:
            self.pause_reading()
        exchange.wake()

    def on_message_complete(self) -> None:
        exchange = self.exchange
        if exchange is None or exchange.complete:
            return
        exchange.more_body = False
        exchange.wake()

    # -- requests -------------------------------------------------------------------------

    def _start(self, exchange: Exchange) -> None:
        self.answering = exchange
        task = self.loop.create_task(exchange.run(self.app))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def answered(self) -> None:
        """A request's answer is complete: start the next pipelined one, or wait for one
        for the keep-alive time."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.resume_reading()
        if self.pipeline:
            self._start(self.pipeline.pop())
        else:
            self.idle.add(self)

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

    async def drain(self) -> None:
        """Wait until the transport takes writes again."""
        writable = self.writable
        if writable is None or writable.done():  # (one whose waiter was cancelled is done)
            writable = self.writable = self.loop.create_future()
        await writable

    def _reject(self, status: int, message: bytes) -> None:
        self.transport.write(
            b"".join(
                [
                    STATUS_LINES[status],
                    self.default_head(),
                    b"content-type: text/plain; charset=utf-8\r\n",
                    b"content-length: %d\r\n" % len(message),
                    b"connection: close\r\n\r\n",
                    message,
                ]
            )
        )
        self.transport.close()

    # -- Uvicorn's server's calls ---------------------------------------------------------

    def shutdown(self) -> None:
        """The server is stopping: close now if idle, else after the current answer."""
        exchange = self.exchange
        if exchange is None or exchange.complete:
            self.transport.close()
        else:
            exchange.keep_alive = False

    def close_idle(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()


def _address(transport: Any, which: str) -> tuple[str, int] | None:
    info = transport.get_extra_info(which)
    if isinstance(info, (list, tuple)) and len(info) >= 2:
        return (str(info[0]), int(info[1]))
    return None


def connection_class(keep_alive: float, loop: Any, max_header_bytes: int = MAX_HEADER_BYTES) -> Any:
    """What Uvicorn's ``http=`` takes: makes a :class:`Connection` on ``loop`` whose
    idle time is ``keep_alive`` seconds, sharing one timer with the loop's others, and
    whose requests' headers are bounded by ``max_header_bytes``."""
    idle: Delays[Connection] = backend().delays(keep_alive, Connection.close_idle)

    def connection(*args: Any, **kwargs: Any) -> Connection:
        return Connection(*args, loop=loop, idle=idle, max_header_bytes=max_header_bytes, **kwargs)

    return connection
