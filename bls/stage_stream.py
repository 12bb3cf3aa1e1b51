"""What ``stage.stream(name, req)`` returns: a stage's items as the script reads them
(:class:`StageStream`, made by :meth:`bls.runtime.Runtime.stream`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from typing import Any

from .bindings import Binding
from .scope import CallContext, OpenStreams, traced_stream

__all__ = ["StageStream"]


class StageStream:
    """The async iterator returned by ``stage.stream(name, req)``.

    Items are converted to the declared item type. An error or a cancel while it waits
    for an item ends the underlying stream (the worker's generator is closed, a remote
    call is cancelled). A loop left early (``break``) leaves it open until the request it
    belongs to ends, which closes it (:class:`bls.scope.RequestScope`; outside any
    request, the runtime's exit); ``async with stage.stream(...) as items`` closes it at
    the end of the block instead.
    """

    __slots__ = ("_binding", "_ctx", "_it", "_open", "_req")

    def __init__(self, binding: Binding, req: Any, ctx: CallContext, open: OpenStreams) -> None:
        self._binding = binding
        self._req = req
        self._ctx = ctx
        self._open = open  # the request's streams, which closes this one if it is left open
        self._it: AsyncIterator[Any] | None = None

    def __aiter__(self) -> StageStream:
        return self

    async def __anext__(self) -> Any:
        it = self._it
        if it is None:
            binding, ctx = self._binding, self._ctx
            if ctx.trace is None:
                it = self._it = binding.stream(self._req, ctx)
            else:
                opener = partial(binding.stream, self._req)
                it = self._it = traced_stream(ctx, binding.name, binding.description, opener)
            self._open.add(self)
        try:
            item = await it.__anext__()
        except BaseException:  # its end, its error, or a cancel: over either way
            self._open.discard(self)
            raise
        return self._binding.result(item)

    async def aclose(self) -> None:
        it, self._it = self._it, None
        self._open.discard(self)
        close = getattr(it, "aclose", None)
        if close is not None:
            await close()

    async def __aenter__(self) -> StageStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
