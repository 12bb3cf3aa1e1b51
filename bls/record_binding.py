"""Recording in front of each stage: :class:`RecordingBinding` notes every call a request
makes in its :class:`bls.recording.Recorder` (which the request's
:class:`bls.scope.CallContext` carries; nothing is noted outside a request that keeps
one), and :func:`noted_items` a streaming entry's items. A recovered background run's
calls that its journal finished are answered from it instead (:mod:`bls.resume`)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import anyio

from .bindings import Wrapper
from .recording import RecordedCall, Recorder
from .scope import NO_CONTEXT, CallContext
from .typenames import TypeRef, ref_of

__all__ = ["RecordingBinding", "noted_items"]


class RecordingBinding(Wrapper):
    """``inner``, with every call noted in the request's :class:`Recorder` (when the
    request keeps one: ``ctx.record``); a call a recovered run finished before is
    answered from its journal instead (:class:`bls.resume.Resume`)."""

    result_ref: TypeRef | None = None  # result_type by name, for the record (ref_of)

    def expect(self, tp: Any) -> None:
        super().expect(tp)
        self.result_ref = ref_of(tp)

    async def invoke(self, req: Any, ctx: CallContext = NO_CONTEXT) -> Any:
        recorder: Recorder | None = ctx.record
        if recorder is None:
            return await self.inner.invoke(req, ctx)
        seq = None
        if recorder.resume is not None:
            taken = recorder.resume.take(self, req)
            if taken is not None and taken.call is not None:
                if taken.call.error is not None:
                    await taken.fail(recorder.resume)
                return taken.value(0, self.result_type, recorder.resume)
            seq = None if taken is None else taken.seq
        call = recorder.call(self.name, False, req, self.result_ref, seq)
        if recorder.durable:
            await recorder.saved(call, done=False)
        try:
            result = await self.inner.invoke(req, ctx)
        except BaseException as exc:
            recorder.ended(call, exc)
            if recorder.durable:
                await _saved_end(recorder, call)
            raise
        recorder.result(call, result)
        if recorder.durable:
            await _saved_end(recorder, call)
        return result

    async def call(self, req: Any, ctx: CallContext = NO_CONTEXT) -> Any:
        return await self.invoke(req, ctx)

    def stream(self, req: Any, ctx: CallContext = NO_CONTEXT) -> AsyncIterator[Any]:
        recorder: Recorder | None = ctx.record
        if recorder is None:
            return self.inner.stream(req, ctx)
        return _recorded(self, req, ctx, recorder)


async def _recorded(
    binding: RecordingBinding, req: Any, ctx: CallContext, recorder: Recorder
) -> AsyncIterator[Any]:
    seq = None
    if recorder.resume is not None:
        taken = recorder.resume.take(binding, req)
        if taken is not None and taken.call is not None:
            for i in range(len(taken.call.items)):
                yield taken.value(i, binding.result_type, recorder.resume)
            if taken.call.error is not None:
                await taken.fail(recorder.resume)
            return
        seq = None if taken is None else taken.seq
    inner = binding.inner
    call = recorder.call(inner.name, True, req, binding.result_ref, seq)
    if recorder.durable:
        await recorder.saved(call, done=False)
    items = inner.stream(req, ctx)
    try:
        async for item in items:
            recorder.item(call, item)
            yield item
    except BaseException as exc:
        recorder.ended(call, exc)
        if recorder.durable:
            await _saved_end(recorder, call)
        raise
    finally:
        close = getattr(items, "aclose", None)
        if close is not None:
            await close()
    recorder.ended(call)
    if recorder.durable:
        await _saved_end(recorder, call)


async def _saved_end(recorder: Recorder, call: RecordedCall) -> None:
    """A durable recorder's call, saved as ended before the script goes on, even in a
    scope that was cancelled meanwhile: a call that ended is never left looking in flight
    (a store's wait is bounded by its own). (Awaited only when the recorder is durable:
    a coroutine made and awaited for nothing costs every recorded call.)"""
    with anyio.CancelScope(shield=True):
        await recorder.saved(call, done=True)


async def noted_items(
    recorder: Recorder, entry: str, req: Any, items: AsyncGenerator[Any, None]
) -> AsyncGenerator[Any, None]:
    """A streaming entry's items, with its request and each item noted."""
    recorder.entry(entry, req)
    try:
        async for item in items:
            recorder.answer(item)
            yield item
    except BaseException as exc:
        recorder.entry_failed(exc)
        raise
    finally:
        await items.aclose()
