"""The asyncio backend of :mod:`bls.loop`: futures for waiters, deadlines on one shared
loop timer, delays and FD readers on the loop's own callbacks."""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import logging
import math
from collections.abc import Awaitable, Callable, Hashable
from typing import TypeVar

import anyio

from ._delays import DELAY_STEP, Due
from ._interface import Deadline, Delays, FdReader, Waiter, checked

__all__ = ["AsyncioBackend", "Timers", "running"]

log = logging.getLogger("bls")

K = TypeVar("K", bound=Hashable)


class Timers:
    """Many callbacks at given loop times on one loop timer.

    Callbacks share 1 ms buckets, and the loop timer is armed for the earliest bucket
    only: adding and removing are a dict and a set operation. Never early."""

    __slots__ = ("_armed", "_buckets", "_handle", "_keys", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._buckets: dict[int, set[Callable[[], object]]] = {}
        self._keys: list[int] = []  # a heap of bucket keys (ms of loop time)
        self._armed = 0  # the key the loop timer is armed for; 0: none
        self._handle: asyncio.TimerHandle | None = None

    def add_key(self, key: int, fn: Callable[[], object]) -> int:
        """Call ``fn`` once at loop time ``key`` ms; returns what :meth:`remove` takes."""
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = set()
            heapq.heappush(self._keys, key)
            if not self._armed or key < self._armed:
                self._arm(key)
        bucket.add(fn)
        return key

    def remove(self, key: int, fn: Callable[[], object]) -> None:
        bucket = self._buckets.get(key)
        if bucket is not None:
            bucket.discard(fn)

    def _arm(self, key: int) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._armed = key
        self._handle = self._loop.call_at(key / 1000, self._fire)

    def _fire(self) -> None:
        self._handle = None
        self._armed = 0
        now = math.floor(self._loop.time() * 1000)
        keys, buckets = self._keys, self._buckets
        while keys and keys[0] <= now:
            for fn in buckets.pop(heapq.heappop(keys), ()):
                try:
                    fn()
                except Exception:  # one callback's bug must not stop the others
                    log.exception("a timer callback failed")
        while keys and not buckets.get(keys[0]):  # empty buckets: forget them now
            buckets.pop(heapq.heappop(keys), None)
        if keys:
            self._arm(keys[0])


class _Deadline:
    """A scope's deadline on the shared :class:`Timers`, or in a shared delay's queue.

    A deadline moved later keeps its timer (it checks again when it fires, and files
    itself again), and one more than a second away is filed under its whole second, early
    (it files itself again then, to the millisecond): a server holds a deadline minutes
    away for each request, and a bucket per millisecond until then would be 1,000 sets a
    second."""

    __slots__ = ("_backend", "_key", "_queue", "_scope", "_when")

    def __init__(self, backend: AsyncioBackend, scope: anyio.CancelScope) -> None:
        self._backend = backend
        self._scope = scope
        self._when = math.inf  # loop time
        self._key: int | None = None  # the bucket it is filed under
        self._queue: Delays[_Deadline] | None = None  # the shared delay it waits in

    def at(self, when: float) -> None:
        checked(when)
        self._leave_queue()
        self._when = when
        self._file()

    def after(self, seconds: float) -> None:
        checked(seconds)
        queue = self._backend.shared.get(seconds)
        if queue is None:
            self.at(self._backend.loop.time() + seconds)
            return
        self._unfile()
        self._when = self._backend.loop.time() + seconds
        self._queue = queue
        queue.add(self)

    def clear(self) -> None:
        self._when = math.inf
        self._unfile()
        self._leave_queue()

    def _file(self) -> None:
        when = self._when
        if when == math.inf:
            self._unfile()
            return
        loop = self._backend.loop
        key = math.floor(when) * 1000 if when - loop.time() > 1.0 else math.ceil(when * 1000)
        if self._key is not None:
            if self._key <= key:
                return  # it fires first, and files itself again then
            self._backend.timers.remove(self._key, self._fire)
        self._key = self._backend.timers.add_key(key, self._fire)

    def _unfile(self) -> None:
        if self._key is not None:
            self._backend.timers.remove(self._key, self._fire)
            self._key = None

    def _leave_queue(self) -> None:
        if self._queue is not None:
            self._queue.discard(self)
            self._queue = None

    def _fire(self) -> None:
        """The shared timers' call: the deadline, or one it moved later from."""
        self._key = None
        if self._backend.loop.time() < self._when:
            self._file()
        else:
            self._scope.cancel()

    def _due(self) -> None:
        """Its shared delay's call: the deadline it was set to."""
        self._queue = None
        self._scope.cancel()


class _Future:
    """A :class:`bls.loop.Waiter` on an asyncio future."""

    __slots__ = ("_future",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._future = loop.create_future()

    async def wait(self) -> None:
        await self._future

    def wake(self) -> bool:
        if self._future.done():
            return False  # cancelled while it waited
        self._future.set_result(None)
        return True


class _Delays(Due[K]):
    """One loop timer, armed for the first key due and at most once a millisecond."""

    __slots__ = ("_handle", "_loop")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, delay: float, fire: Callable[[K], object]
    ) -> None:
        super().__init__(loop.time, delay, fire)
        self._loop = loop
        self._handle: asyncio.TimerHandle | None = None

    def _started(self, when: float) -> None:
        if self._handle is None:
            self._handle = self._loop.call_at(when, self._run)

    def _run(self) -> None:
        self._handle = None
        now = self._loop.time()
        when = self._fire_due(now)
        if when is not None:
            self._handle = self._loop.call_at(max(when, now + DELAY_STEP), self._run)


class _Reader:
    """The FD stays registered with the loop and ``drain`` runs from the loop's callback:
    no task wakes up per message, and no ``epoll_ctl`` pair per wait."""

    __slots__ = ("_context", "_drain", "_fd", "_loop", "_soon")

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, drain: Callable[[], None]) -> None:
        self._loop = loop
        self._fd = fd
        self._drain = drain
        self._soon = False
        # The reader's context (made in its task): a drain a send asked for must not
        # dispatch in the sender's.
        self._context = contextvars.copy_context()

    async def run(self) -> None:
        self._loop.add_reader(self._fd, self._drain)
        try:
            self._drain()
            await anyio.sleep_forever()
        finally:
            self._loop.remove_reader(self._fd)

    def check(self) -> None:
        # Once per loop turn, however many tasks sent.
        if not self._soon:
            self._soon = True
            self._loop.call_soon(self._now, context=self._context)

    again = check

    def _now(self) -> None:
        self._soon = False
        self._drain()

    @property
    def pending(self) -> bool:
        return self._soon


class AsyncioBackend:
    """:class:`bls.loop.Backend` on one asyncio loop."""

    name = "asyncio"

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.timers = Timers(loop)
        self.shared: dict[float, Delays[_Deadline]] = {}  # shared delays' queues
        self.cancel_scope = _scope_maker()

    def deadline(self, scope: anyio.CancelScope) -> Deadline:
        return _Deadline(self, scope)

    def share(self, seconds: float) -> None:
        if seconds not in self.shared and math.isfinite(seconds):
            self.shared[seconds] = _Delays(self.loop, seconds, _Deadline._due)

    def waiter(self) -> Waiter:
        return _Future(self.loop)

    def now(self) -> float:
        return self.loop.time()

    def delays(self, delay: float, fire: Callable[[K], object]) -> Delays[K]:
        return _Delays(self.loop, delay, fire)

    def spawn(self, fn: Callable[[], Awaitable[None]]) -> Callable[[], object]:
        # A bare task: one per request in a task group costs more than the rest of a small
        # request, and the watcher needs none of a group's guarantees.
        return self.loop.create_task(fn()).cancel  # type: ignore[arg-type]

    def fd_reader(self, fd: int, drain: Callable[[], None]) -> FdReader:
        return _Reader(self.loop, fd, drain)


def _scope_maker() -> Callable[..., anyio.CancelScope]:
    """The class of the running backend's cancel scopes (anyio's public class makes one
    of these, looking the backend up first): called with ``shield=``, it makes one."""
    return type(anyio.CancelScope())


_backends: dict[asyncio.AbstractEventLoop, AsyncioBackend] = {}


def running() -> AsyncioBackend:
    """The running loop's backend (made at its first use)."""
    loop = asyncio.get_running_loop()
    found = _backends.get(loop)
    if found is None:
        for old in [lp for lp in _backends if lp.is_closed()]:
            del _backends[old]  # loops come and go in tests
        found = _backends[loop] = AsyncioBackend(loop)
    return found
