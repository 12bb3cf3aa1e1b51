"""One remote streaming call: its items as they come, with credit-based flow control.

The worker may send :data:`WINDOW` items ahead of what the caller has read; the caller
grants more as it reads, so a slow loop pauses the worker and memory stays bounded. The
stream ends with the worker's END (or its error); closing it early (``aclose``: the
request it belongs to ended, a ``break`` in an ``async with``) tells the worker to stop.
It reaches the binding through :class:`CallStarter`, that binding's public side.
"""

from __future__ import annotations

from typing import Any, Protocol

from bls.errors import ErrorKind, StageError
from bls.scope import CallContext

from . import wire
from .connection import Connection, Inbox, adopt_spans
from .wire import ErrorInfo, Kind

__all__ = ["WINDOW", "CallStarter", "RemoteStream"]

WINDOW = 128  # stream items a worker may send ahead of the consumer (the memory bound)


class CallStarter(Protocol):
    """What a stream needs of its binding (:class:`.replicas.RemoteBinding`)."""

    name: str

    async def start_call(
        self, body: list[Any], credit: int, ctx: CallContext
    ) -> tuple[Connection, Inbox, int, Any]: ...

    def decode_item(self, rest: Any, ctx: CallContext) -> Any: ...

    def error(self, info: ErrorInfo, conn: Connection) -> Exception: ...


class RemoteStream:
    """Items of one remote streaming call, with credit-based flow control."""

    __slots__ = ("_binding", "_body", "_call", "_conn", "_ctx", "_finished", "_unacked")

    def __init__(self, binding: CallStarter, body: list[Any], ctx: CallContext) -> None:
        self._binding = binding
        self._body = body
        self._ctx = ctx
        self._conn: Connection | None = None
        self._call: Inbox | None = None
        self._finished = False
        self._unacked = 0

    def __aiter__(self) -> RemoteStream:
        return self

    async def __anext__(self) -> Any:
        if self._finished:
            raise StopAsyncIteration
        try:
            if self._call is None:
                self._conn, self._call, kind, rest = await self._binding.start_call(
                    self._body, WINDOW, self._ctx
                )
            else:
                kind, rest = await self._call.get()
        except BaseException:
            self._close()
            raise
        assert self._conn is not None and self._call is not None
        if kind == Kind.DATA:
            self._unacked += 1
            if self._unacked >= WINDOW // 2:
                self._conn.grant(self._call, self._unacked)
                self._unacked = 0
            try:
                return self._binding.decode_item(rest, self._ctx)
            except BaseException:
                self._close()
                raise
        self._close()
        adopt_spans(self._call, self._ctx)
        if kind == Kind.END:
            raise StopAsyncIteration
        if kind == Kind.ERROR:
            raise self._binding.error(wire.decode_error(rest[0]), self._conn)
        raise StageError(
            self._binding.name,
            ErrorKind.UNAVAILABLE,
            f"the worker at {self._conn.address} was lost mid-stream: {rest}",
        )

    def _close(self) -> None:
        self._finished = True
        if self._conn is not None and self._call is not None:
            self._conn.end_call(self._call, self._ctx)

    async def aclose(self) -> None:
        self._close()
