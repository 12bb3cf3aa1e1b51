"""``@bls.batch``: dynamic batching, for any worker.

A worker written for a batch — ``async def __call__(self, reqs: list[Req]) -> list[Resp]``
— decorated with ``@bls.batch(max_batch_size=32, max_delay_ms=2)`` is called by scripts
one request at a time, like any unary stage (``await stage("encoder", req)``). Concurrent
calls are coalesced: a batch runs when ``max_batch_size`` requests are waiting, or when
the oldest has waited ``max_delay_ms``; each caller gets its own result back, in order.
One batch runs at a time per worker; requests that arrive meanwhile form the next one.

Cancellation: a caller cancelled while its request waits is taken out of the batch
before it runs. A batch that has started runs to the end (shielded), so the other callers
in it get their results; a cancelled caller's result is dropped. If the batch function
raises, every caller in that batch gets the error; to fail one request alone (an image
that is not one), put the exception in the returned list in its place: that caller gets
it raised, the others their results.

The same worker batches inline and behind ``bls worker`` (the worker serves concurrent
calls, which the batcher coalesces). A worker's ``Options`` may carry
``max_batch_size``/``max_delay_ms`` fields: they override the decorator's values.
"""

from __future__ import annotations

import collections
import functools
import operator
import types
import typing
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from .messages import Signature, signature_of

__all__ = ["Batcher", "batch"]


class _Slot:
    __slots__ = ("done", "error", "request", "value", "wake")

    def __init__(self, request: Any) -> None:
        self.request = request
        self.wake = anyio.Event()  # set when done, or when the batch should run now
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None


def _item_type(tp: Any) -> Any:
    """``T`` of ``list[T]`` (``Any`` otherwise)."""
    if typing.get_origin(tp) in (list, collections.abc.Sequence, typing.Sequence):
        args = typing.get_args(tp)
        return args[0] if args else Any
    return Any


def _result_type(tp: Any) -> Any:
    """The result type of one call, from the batch function's ``list[T]``: ``T``, without
    the exception types a batch may return in place of a result (``Embedding | Exception``
    is ``Embedding``)."""
    item = _item_type(tp)
    if typing.get_origin(item) in (typing.Union, types.UnionType):
        kept = [a for a in typing.get_args(item) if not _is_exception(a)]
        return functools.reduce(operator.or_, kept) if kept else Any
    return item


def _is_exception(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseException)


class Batcher:
    """Coalesces concurrent single calls into calls of ``fn`` on lists.

    Call it with one request, await one result. ``batches`` and ``batched`` count the
    batches run and the requests they held.
    """

    def __init__(
        self,
        fn: Callable[[list[Any]], Awaitable[list[Any]]],
        max_batch_size: int,
        max_delay_ms: float,
        signature: Signature,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        if max_delay_ms < 0:
            raise ValueError(f"max_delay_ms must not be negative, got {max_delay_ms}")
        self.fn = fn
        self.max_batch_size = max_batch_size
        self.max_delay = max_delay_ms / 1000
        self.__bls_signature__ = signature
        self.batches = 0
        self.batched = 0
        self._pending: collections.deque[_Slot] = collections.deque()
        self._lock: anyio.Lock | None = None

    async def __call__(self, request: Any) -> Any:
        slot = _Slot(request)
        pending = self._pending
        pending.append(slot)
        if self._lock is None:
            self._lock = anyio.Lock()
        try:
            if len(pending) >= self.max_batch_size:
                pending[0].wake.set()  # a full batch: its oldest caller runs it now
            if not slot.wake.is_set() and self.max_delay > 0:
                with anyio.move_on_after(self.max_delay):
                    await slot.wake.wait()
            while not slot.done:
                async with self._lock:  # one batch at a time; waiting here is cancellable
                    if slot.done:
                        break
                    await self._run(self._take())
        except BaseException:
            if not slot.done:
                try:
                    pending.remove(slot)  # never run a cancelled caller's request
                except ValueError:
                    pass  # already in a running batch: its result is dropped
            raise
        if slot.error is not None:
            raise slot.error
        return slot.value

    @property
    def waiting(self) -> int:
        """Requests waiting for a batch to run them (the queue's depth)."""
        return len(self._pending)

    def _take(self) -> list[_Slot]:
        pending = self._pending
        return [pending.popleft() for _ in range(min(len(pending), self.max_batch_size))]

    async def _run(self, slots: list[_Slot]) -> None:
        if not slots:
            return
        self.batches += 1
        self.batched += len(slots)
        # Shielded: the others in this batch must not lose their results because the
        # caller that happens to run it was cancelled.
        with anyio.CancelScope(shield=True):
            try:
                results = await self.fn([s.request for s in slots])
                if len(results) != len(slots):
                    raise ValueError(
                        f"a batched worker returned {len(results)} results for "
                        f"{len(slots)} requests"
                    )
                for slot, value in zip(slots, results, strict=True):
                    if isinstance(value, BaseException):
                        slot.error = value
                    else:
                        slot.value = value
            except Exception as exc:
                for slot in slots:
                    slot.error = exc
        for slot in slots:
            slot.done = True
            slot.wake.set()
        if self._pending and len(self._pending) >= self.max_batch_size:
            self._pending[0].wake.set()


class _BatchedMethod:
    """What ``@bls.batch`` makes of a method: one :class:`Batcher` per instance."""

    def __init__(self, fn: Callable[..., Any], max_batch_size: int, max_delay_ms: float):
        self.fn = fn
        self.max_batch_size = max_batch_size
        self.max_delay_ms = max_delay_ms
        sig = signature_of(fn, skip_self=True)
        self.__bls_signature__ = Signature(
            request=_item_type(sig.request), response=_result_type(sig.response), streaming=False
        )
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]
        self._name = fn.__name__

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        batcher = obj.__dict__.get(self._name)
        if batcher is None:
            options = getattr(obj, "options", None)
            size = getattr(options, "max_batch_size", None)
            delay = getattr(options, "max_delay_ms", None)
            batcher = Batcher(
                functools.partial(self.fn, obj),
                self.max_batch_size if size is None else int(size),
                self.max_delay_ms if delay is None else float(delay),
                self.__bls_signature__,
            )
            obj.__dict__[self._name] = batcher
        return batcher


def batch(
    *, max_batch_size: int = 32, max_delay_ms: float = 2.0
) -> Callable[[Callable[..., Any]], Any]:
    """Make a list-taking async method (or function) a dynamically batched stage.

    The stage's request type is the list's item type, and its response type the
    returned list's item type. See the module documentation for the semantics.
    """

    def wrap(fn: Callable[..., Any]) -> Any:
        if fn.__code__.co_varnames[:1] == ("self",):
            return _BatchedMethod(fn, max_batch_size, max_delay_ms)
        sig = signature_of(fn)
        return Batcher(
            fn,
            max_batch_size,
            max_delay_ms,
            Signature(_item_type(sig.request), _result_type(sig.response), False),
        )

    return wrap
