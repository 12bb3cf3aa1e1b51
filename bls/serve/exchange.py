"""One request and its answer: the ASGI ``receive`` and ``send`` of the task that answers
it, on either driver.

The bytes are :mod:`.http11`'s (:class:`.http11.Answer` frames the answer); the I/O is
the connection's (:class:`Link`, a driver's :class:`.peer.Peer`); what is left here is
ASGI: the messages, the two extensions each request's scope offers, and what an
application that fails is answered. It keeps what Uvicorn's httptools protocol does
(``100 Continue`` when the application first reads, ``500`` for an application that fails
before its answer went out and a close after), at a lower price per request:

- the body reaches the task without an ``asyncio.Event``: a request whose body came with
  its head (most) never waits; such a body can be taken whole, with no message (the
  ``bls.request.body`` extension, :data:`.framing.BODY`);
- a whole answer may come in one message (the ``bls.response.whole`` extension,
  :data:`.framing.WHOLE`), its head's lines formatted by the application: one message,
  and no header to parse or check, for the answers bls sends most.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from ..console import loggable
from ..loop import Waiter, backend
from .framing import BODY, WHOLE
from .http11 import Answer, Head

__all__ = ["Exchange", "Link", "asgi_scope"]

log = logging.getLogger("bls.http")


class Link(Protocol):
    """What an exchange needs of its connection (a driver's :class:`.peer.Peer`)."""

    async def write(self, data: bytes) -> None:
        """Write ``data``, waiting while the client does not read (never raises: a client
        gone is the exchange's ``disconnected``)."""

    async def more(self, exchange: Exchange) -> None:
        """Wait until ``exchange`` has more of its body, or its client has left, or its
        answer is complete (any of them may already be so)."""

    def body_taken(self, exchange: Exchange) -> None:
        """``exchange``'s body taken so far was read (reading may go on)."""

    def answered(self, exchange: Exchange) -> None:
        """``exchange``'s answer is complete."""

    def close(self) -> None:
        """Close the connection (after what was written)."""


class Exchange:
    """One request and its answer: the ASGI ``receive`` and ``send`` of its task."""

    __slots__ = (
        "answer",
        "body",
        "disconnected",
        "link",
        "more_body",
        "read",
        "scope",
        "waiter",
    )

    def __init__(self, link: Link, scope: dict[str, Any], answer: Answer) -> None:
        self.link = link
        self.answer = answer
        # The scope offers self.take (framing.BODY): held here only until the application
        # runs with it, then by its task alone (no cycle for the garbage collector).
        self.scope: dict[str, Any] | None = scope
        scope["extensions"] = {WHOLE: {}, BODY: {"take": self.take}}
        self.body = bytearray()
        self.more_body = True
        self.read = False  # the whole body went to the application
        self.waiter: Waiter | None = None  # what a receive() waiting for the body waits on
        self.disconnected = False

    def wake(self) -> None:
        """The body grew, or ended, or the client left: a waiting receive() looks again."""
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            waiter.wake()

    async def woken(self) -> None:
        """Wait for :meth:`wake` (a driver's :meth:`Link.more`, once it knows that someone
        else reads)."""
        self.waiter = waiter = backend().waiter()
        try:
            await waiter.wait()
        finally:
            self.waiter = None

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
            if not self.answer.complete and not self.disconnected:
                log.error(
                    "%s: the application returned before its answer was complete", _what(scope)
                )
                await self._fail()

    async def _fail(self) -> None:
        """End an answer the application did not finish: a 500 while nothing of it has
        gone out (a head held back for its body is dropped), else a close."""
        if not self.answer.drop_held():
            self.link.close()
            return
        body = b"Internal Server Error"
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", b"%d" % len(body)),
            (b"connection", b"close"),
        ]
        await self.send({"type": "http.response.start", "status": 500, "headers": headers})
        await self.send({"type": "http.response.body", "body": body})

    def take(self) -> bytes | None:
        """The whole body, if all of it is here and none was received (:data:`.framing.BODY`)."""
        if self.more_body or self.read or self.answer.expect_continue or self.disconnected:
            return None
        self.read = True
        return bytes(self.body)

    async def receive(self) -> dict[str, Any]:
        answer = self.answer
        if answer.expect_continue:
            owed = answer.continue_()
            if owed and not self.disconnected:
                await self.link.write(owed)
        # Wait for more of the body, or (once it is all read) for the client to leave.
        while not (self.disconnected or answer.complete) and (
            self.read or (self.more_body and not self.body)
        ):
            await self.link.more(self)
        if self.disconnected or answer.complete:
            return {"type": "http.disconnect"}
        body = bytes(self.body)
        self.body.clear()
        more = self.more_body
        if more:
            self.link.body_taken(self)
        else:
            self.read = True
        return {"type": "http.request", "body": body, "more_body": more}

    async def send(self, message: dict[str, Any]) -> None:
        if self.disconnected:
            return
        answer = self.answer
        kind = message["type"]
        if not answer.started:
            if kind == WHOLE:
                data = answer.whole(message["status"], message["head"], message["body"])
            elif kind != "http.response.start":
                raise RuntimeError(f"expected 'http.response.start', got {kind!r}")
            else:
                data = answer.start(message["status"], message.get("headers", ()))
        elif not answer.complete:
            if kind != "http.response.body":
                raise RuntimeError(f"expected 'http.response.body', got {kind!r}")
            data = answer.body(message.get("body", b""), message.get("more_body", False))
        else:
            raise RuntimeError(f"{kind!r} sent after the answer was complete")
        if data:
            await self.link.write(data)
        if answer.complete:
            self.wake()  # (a receive() waiting for the client to leave: it need not)
            if not answer.keep_alive:
                self.link.close()
            self.link.answered(self)


def asgi_scope(head: Head, connection: dict[str, Any]) -> dict[str, Any]:
    """The ASGI scope of a request: its ``head``, and what the driver knows of the
    connection (``server``, ``client``, ``scheme``, ``root_path``, ``state``)."""
    root = connection["root_path"]
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": head.version,
        "server": connection["server"],
        "client": connection["client"],
        "scheme": connection["scheme"],
        "root_path": root,
        "headers": head.headers,
        "state": connection["state"].copy(),
        "method": head.method,
        "path": root + head.path if root else head.path,
        "raw_path": root.encode("ascii") + head.raw_path if root else head.raw_path,
        "query_string": head.query,
    }


def _what(scope: dict[str, Any]) -> str:
    return f"{scope['method']} {loggable(scope['path'])}"
