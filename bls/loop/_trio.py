"""The trio backend of :mod:`bls.loop`: trio's own deadlines and events, delays and the
disconnect watcher as system tasks, an FD reader as a task waiting on the FD."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable
from typing import TypeVar

import anyio
import anyio.lowlevel
import trio

from ._delays import DELAY_STEP, Due
from ._interface import Deadline, Delays, FdReader, Waiter, checked

__all__ = ["TRIO", "TrioBackend"]

K = TypeVar("K", bound=Hashable)


class _Deadline:
    """The scope's own deadline: trio's are cheap."""

    __slots__ = ("_scope",)

    def __init__(self, scope: anyio.CancelScope) -> None:
        self._scope = scope

    def at(self, when: float) -> None:
        self._scope.deadline = checked(when)

    def after(self, seconds: float) -> None:
        self._scope.deadline = trio.current_time() + checked(seconds)

    def clear(self) -> None:
        self._scope.deadline = float("inf")


class _Event:
    """A :class:`bls.loop.Waiter` on an anyio Event."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = anyio.Event()

    async def wait(self) -> None:
        await self._event.wait()

    def wake(self) -> bool:
        self._event.set()
        return True


class _Delays(Due[K]):
    """:class:`bls.loop.Delays` on a system task that runs while keys wait."""

    __slots__ = ("_running",)

    def __init__(self, delay: float, fire: Callable[[K], object]) -> None:
        super().__init__(anyio.current_time, delay, fire)
        self._running = False

    def _started(self, when: float) -> None:
        if not self._running:
            self._running = True
            trio.lowlevel.spawn_system_task(self._run)

    async def _run(self) -> None:
        try:
            now = anyio.current_time()
            when = self._fire_due(now)
            while when is not None:  # (keys wait until due: no event to wait for instead)
                await anyio.sleep_until(max(when, now + DELAY_STEP))
                now = anyio.current_time()
                when = self._fire_due(now)
        finally:
            self._running = False


class _Reader:
    """A task waits on the FD; a drain elsewhere that ends with input left wakes it (it may
    be waiting for an edge that drain took). A check after a send drains at once: dispatch
    is synchronous, so this is safe in any task."""

    __slots__ = ("_drain", "_fd", "_more", "_waiting")

    def __init__(self, fd: int, drain: Callable[[], None]) -> None:
        self._fd = fd
        self._drain = drain
        self._more = False
        self._waiting: anyio.CancelScope | None = None

    async def run(self) -> None:
        while True:
            self._more = False
            self._drain()
            if self._more:  # a batch ended with input left: let other tasks run first
                await anyio.lowlevel.checkpoint()
                continue
            with anyio.CancelScope() as self._waiting:
                await anyio.wait_readable(self._fd)
            self._waiting = None

    def check(self) -> None:
        self._drain()

    def again(self) -> None:
        self._more = True
        if self._waiting is not None:
            self._waiting.cancel()

    @property
    def pending(self) -> bool:
        return self._more


class TrioBackend:
    """:class:`bls.loop.Backend` on trio."""

    name = "trio"

    def __init__(self) -> None:
        self._make: Callable[..., anyio.CancelScope] | None = None

    def cancel_scope(self, shield: bool = False) -> anyio.CancelScope:
        if self._make is None:
            # The class of trio's anyio cancel scopes (anyio's public class makes one of
            # these, looking the backend up first).
            self._make = type(anyio.CancelScope())
        return self._make(shield=shield)

    def deadline(self, scope: anyio.CancelScope) -> Deadline:
        return _Deadline(scope)

    def share(self, seconds: float) -> None:
        pass  # (every deadline is its scope's own)

    def waiter(self) -> Waiter:
        return _Event()

    def now(self) -> float:
        return trio.current_time()

    def delays(self, delay: float, fire: Callable[[K], object]) -> Delays[K]:
        return _Delays(delay, fire)

    def spawn(self, fn: Callable[[], Awaitable[None]]) -> Callable[[], object]:
        stopper = trio.CancelScope()

        async def task() -> None:
            with stopper:
                await fn()

        trio.lowlevel.spawn_system_task(task)
        return stopper.cancel

    def fd_reader(self, fd: int, drain: Callable[[], None]) -> FdReader:
        return _Reader(fd, drain)


TRIO = TrioBackend()
