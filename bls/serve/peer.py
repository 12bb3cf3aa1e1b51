"""One client connection, on whichever event loop: its requests parsed (:mod:`.http11`)
and answered in order, one :class:`.exchange.Exchange` each.

A :class:`Peer` holds what both drivers share: the parser, the request being answered
and those waiting behind it (pipelined: answered in order, and nothing more is read while
one waits), the body each has been sent so far, and the client leaving. A driver
subclasses it with the I/O (:mod:`.asyncio_http`: pushed by asyncio's protocol calls;
:mod:`.trio_http`: pulled by whoever waits for input) and starts the exchanges.
"""

from __future__ import annotations

import collections
from typing import Any

from .exchange import Exchange, asgi_scope
from .http11 import END, HIGH_WATER, UPGRADE, Answer, Head, Refusal, RequestParser, refusal

__all__ = ["Peer"]


class Peer:
    """A client connection's requests (module docstring). ``connection`` is what the
    driver knows of it for each request's scope (``server``, ``client``, ``scheme``,
    ``root_path``, ``state``)."""

    def __init__(self, app: Any, connection: dict[str, Any], max_header_bytes: int) -> None:
        self.app = app
        self.connection = connection
        self.parser = RequestParser(max_header_bytes)
        self.current: Exchange | None = None  # the request being answered
        self.waiting: collections.deque[Exchange] = collections.deque()  # pipelined after it
        self.parsing: Exchange | None = None  # the request whose body is arriving
        self.refused: bytes = b""  # a refusal to write once the answer in flight is out

    # -- what the driver provides ------------------------------------------------------------

    def default_head(self) -> bytes:
        """The lines every answer carries (the server's default headers)."""
        raise NotImplementedError

    def pause_reading(self) -> None:
        """Read no more for now (a pipelined request waits, or a body piles up)."""

    def resume_reading(self) -> None:
        """Read again."""

    async def write(self, data: bytes) -> None:
        """(:class:`.exchange.Link`)"""
        raise NotImplementedError

    async def more(self, exchange: Exchange) -> None:
        """(:class:`.exchange.Link`)"""
        raise NotImplementedError

    def answered(self, exchange: Exchange) -> None:
        """(:class:`.exchange.Link`)"""
        raise NotImplementedError

    # -- input -------------------------------------------------------------------------------

    def received(self, data: bytes) -> bytes:
        """Parse ``data`` and hand each request what came of it. Returns the refusal to
        write before closing (b"": go on). A refusal while an answer is still going out
        waits for it: :attr:`refused`."""
        for event in self.parser.feed(data):
            kind = type(event)
            if kind is bytes:
                self._body(event)  # type: ignore[arg-type]
            elif kind is Head:
                self._head(event)  # type: ignore[arg-type]
            elif event is END:
                if self.parsing is not None and not self.parsing.answer.complete:
                    self.parsing.more_body = False
                    self.parsing.wake()
            elif event is UPGRADE:
                self._upgrade()
            else:
                assert isinstance(event, Refusal)
                return self._refuse(event)
        return b""

    def _head(self, head: Head) -> None:
        defaults = self.default_head()
        answer = Answer(head.method == "HEAD", head.keep_alive, head.expect_continue, defaults)
        exchange = Exchange(self, asgi_scope(head, self.connection), answer)
        self.parsing = exchange
        if self.current is None and not self.waiting:
            self.current = exchange
            self.start(exchange)
        else:  # pipelined: it waits its turn, and nothing more is read meanwhile
            self.waiting.append(exchange)
            self.pause_reading()

    def _body(self, body: bytes) -> None:
        exchange = self.parsing
        if exchange is None or exchange.answer.complete:
            return
        exchange.body += body
        if len(exchange.body) > HIGH_WATER:
            self.pause_reading()
        exchange.wake()

    def _upgrade(self) -> None:
        exchange = self.parsing
        if exchange is not None:
            exchange.answer.keep_alive = False
            if exchange.answer.complete:
                self.close()

    def _refuse(self, event: Refusal) -> bytes:
        data = refusal(event.status, event.why, self.default_head())
        if self.current is not None and not self.current.answer.complete:
            self.refused = data  # after the answer that is going out
            self.current.answer.keep_alive = False
            return b""
        return data

    def lost(self) -> None:
        """The client is gone: the request being answered hears it (and so do those
        waiting behind it, if they ever start)."""
        for exchange in (self.current, self.parsing, *self.waiting):
            if exchange is not None:
                if not exchange.answer.complete:
                    exchange.disconnected = True
                exchange.wake()

    # -- answers -----------------------------------------------------------------------------

    def start(self, exchange: Exchange) -> None:
        """Run ``exchange``'s application (the driver's way: a task, or in line)."""
        raise NotImplementedError

    def next_exchange(self) -> Exchange | None:
        """The answer just sent: the next pipelined request, now current (reading may go
        on), or None."""
        self.current = self.waiting.popleft() if self.waiting else None
        if not self.waiting:
            self.resume_reading()
        return self.current

    def body_taken(self, exchange: Exchange) -> None:
        self.resume_reading()

    @property
    def idle(self) -> bool:
        """No request is being answered or waits."""
        return self.current is None and not self.waiting

    def close(self) -> None:
        raise NotImplementedError

    def shutdown(self) -> None:
        """The server is stopping: close now if idle, else after the current answer."""
        if self.idle:
            self.close()
            return
        for exchange in (self.current, *self.waiting):
            if exchange is not None:
                exchange.answer.keep_alive = False
