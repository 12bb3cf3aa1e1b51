"""Structured fan-out: ``gather``, ``race``, ``map``, ``collect`` and ``beside``.

Each runs its children in a task group that closes before it returns, so no child
outlives the call, whatever the outcome. Errors are raised as themselves (not wrapped in
an ExceptionGroup) so that a script can ``except StageError``.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterable, Awaitable, Callable, Generator, Iterable
from types import TracebackType
from typing import Any, Generic, TypeVar

import anyio
import anyio.abc

__all__ = ["beside", "collect", "gather", "map", "race"]

T = TypeVar("T")
U = TypeVar("U")


async def gather(*aws: Awaitable[Any]) -> list[Any]:
    """Await all of ``aws`` concurrently and return their results in order.

    On the first failure the others are cancelled (remote work included) and that
    error is raised. Cancelling the caller cancels them all.
    """
    if not aws:
        return []
    results: list[Any] = [None] * len(aws)
    failure: list[BaseException] = []

    async with anyio.create_task_group() as tg:

        async def run(i: int, aw: Awaitable[Any]) -> None:
            try:
                results[i] = await aw
            except Exception as exc:
                if not failure:
                    failure.append(exc)
                    tg.cancel_scope.cancel()

        for i, aw in enumerate(aws):
            tg.start_soon(run, i, aw)
    if failure:
        raise failure[0]
    return results


async def race(*aws: Awaitable[T]) -> T:
    """Return the first successful result; the others are cancelled.

    A failing contender drops out of the race. If every contender fails, the first
    error is raised.
    """
    if not aws:
        raise ValueError("bls.race() needs at least one awaitable")
    won: list[T] = []
    errors: list[BaseException] = []

    async with anyio.create_task_group() as tg:

        async def run(aw: Awaitable[T]) -> None:
            try:
                result = await aw
            except Exception as exc:
                errors.append(exc)
                return
            if not won:
                won.append(result)
                tg.cancel_scope.cancel()

        for aw in aws:
            tg.start_soon(run, aw)
    if won:
        return won[0]
    raise errors[0]


async def map(
    fn: Callable[[T], Awaitable[U]], items: Iterable[T], *, limit: int | None = None
) -> list[U]:
    """Apply ``fn`` to every item with at most ``limit`` calls in flight; results in order.

    Failure behaves as in :func:`gather`: the first error cancels the rest and is raised.
    """
    todo = builtins.list(items)
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"bls.map() limit must be a positive int, got {limit!r}")
    results: list[Any] = [None] * len(todo)
    queue = iter(enumerate(todo))

    async def lane() -> None:
        for i, item in queue:  # lanes share one iterator: each item is taken once
            results[i] = await fn(item)

    await gather(*(lane() for _ in range(min(limit or len(todo), len(todo)))))
    return results


async def collect(items: AsyncIterable[Any]) -> Any:
    """Drain an async iterator: the items as a list, or one string if they are strings.

    The iterator is closed afterwards, also on error or cancellation.
    """
    out: list[Any] = []
    try:
        async for item in items:
            out.append(item)
    finally:
        close = getattr(items, "aclose", None)
        if close is not None:
            with anyio.CancelScope(shield=True):
                await close()
    if out and builtins.all(isinstance(x, str) for x in out):
        return "".join(out)
    return out


class beside(Generic[T]):
    """Run ``aw`` beside a block of the script, and take its result when it is wanted::

        async with bls.beside(classifier(emb)) as labels:
            async for item in generator(prompt):  # runs while the classifier does
                yield item
        top = await labels

    ``await`` the handle inside the block (it waits for ``aw``) or after it. Leaving the
    block waits for ``aw`` to finish. An error in the block cancels ``aw``; an error in
    ``aw`` cancels the block and is raised as itself; cancelling the script cancels both.
    A streaming script may ``yield`` inside the block.
    """

    __slots__ = ("_aw", "_done", "_error", "_result", "_tg")

    def __init__(self, aw: Awaitable[T]) -> None:
        self._aw = aw
        self._done = anyio.Event()
        self._result: T | None = None
        self._error: Exception | None = None
        self._tg: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> beside[T]:
        tg = self._tg = anyio.create_task_group()
        await tg.__aenter__()
        tg.start_soon(self._run)
        return self

    async def _run(self) -> None:
        try:
            self._result = await self._aw
        except Exception as exc:
            self._error = exc
            assert self._tg is not None
            self._tg.cancel_scope.cancel()
        finally:
            self._done.set()

    async def _wait(self) -> T:
        await self._done.wait()
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]

    def __await__(self) -> Generator[Any, None, T]:
        return self._wait().__await__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        assert self._tg is not None
        if exc is not None:
            self._tg.cancel_scope.cancel()
        try:
            suppressed = await self._tg.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:  # the block's own error, wrapped: unwrap it
            if self._error is not None:
                raise self._error from None
            # Beside it, at most the cancellation of an outer scope, which is redelivered
            # at the next checkpoint anyway (trio's, for one, is level-triggered).
            _, rest = group.split(anyio.get_cancelled_exc_class())
            if exc is not None and rest is not None and rest.exceptions == (exc,):
                raise exc.with_traceback(tb) from None
            raise
        if self._error is not None and (exc is None or exc is not self._error):
            raise self._error
        return bool(suppressed)
