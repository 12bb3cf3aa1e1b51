"""Structured fan-out: ``gather``, ``race``, ``map`` and ``collect``.

Each runs its children in a task group that closes before it returns, so no child
outlives the call, whatever the outcome. Errors are raised as themselves (not wrapped in
an ExceptionGroup) so that a script can ``except StageError``.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable
from typing import Any, TypeVar

import anyio

__all__ = ["collect", "gather", "map", "race"]

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
