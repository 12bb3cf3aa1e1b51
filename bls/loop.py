"""The one place that knows asyncio from trio.

Everything else in bls speaks anyio, plus the few things here that anyio does not offer
at the price a hot path can pay:

- :class:`Waiter`: one task parks until a message's dispatch wakes it (a call waiting
  for its reply, an idle worker lane). An asyncio future costs several times less than
  an ``anyio.Event`` there; on trio an Event is what trio has.
- :meth:`Backend.deadline`: a cancel scope's deadline. On asyncio a server holds one for
  every request in flight and moves most of them before they fire; a loop timer each (as
  anyio's own deadlines use) costs more than the rest of a small request, so they share
  one loop timer in 1 ms buckets (:class:`Timers`). On trio, the scope's own deadline.
- :meth:`Backend.watch`: a task beside a request that nothing waits for (the disconnect
  watcher), started late on asyncio (most requests end first) and as a system task on
  trio.
- :meth:`Backend.fd_reader`: the reader of a ZeroMQ socket's edge-triggered FD.

:func:`backend` returns the :class:`Backend` of the running event loop. A process has one
loop in production, so the choice is made once; the test suite runs both, one after the
other, and each loop gets its own.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio
import anyio.lowlevel
import sniffio

__all__ = ["Backend", "FdReader", "Timers", "Waiter", "backend"]

log = logging.getLogger("bls")


class Waiter(Protocol):
    """What one task waits on until another wakes it. Single use."""

    async def wait(self) -> None:
        """Wait until :meth:`wake`; cancellable."""

    def wake(self) -> bool:
        """Wake the waiting task; False if it was cancelled while it waited."""


class FdReader(Protocol):
    """Runs ``drain()`` whenever a socket's FD signals, and when asked to.

    ZeroMQ's FD is edge-triggered: it signals a change, not waiting input, and any send
    or receive may take the signal. ``drain`` reads until no input is left or a batch
    ends; the owner calls :meth:`again` when a batch ended with input left, and
    :meth:`check` after a send, which may have taken the edge.
    """

    async def run(self) -> None:
        """Drain as the FD signals, until cancelled."""

    def check(self) -> None:
        """A send may have taken the edge: drain before the loop next waits."""

    def again(self) -> None:
        """A drain stopped with input left: drain again once other work has run."""

    @property
    def pending(self) -> bool:
        """Whether a drain is already on its way (no edge needed for it)."""


class Backend(Protocol):
    """What bls needs of an event loop beyond anyio."""

    name: str

    def cancel_scope(self, shield: bool = False) -> anyio.CancelScope:
        """A new ``anyio.CancelScope``: the same object, made without looking up the
        running backend (``anyio.CancelScope()`` does that each time: more than half its
        cost on a request's path)."""

    def waiter(self) -> Waiter: ...

    def deadline(
        self, scope: anyio.CancelScope, when: float, armed: Any, fire: Callable[[], object]
    ) -> Any:
        """Make loop time ``when`` (inf: none) the deadline of ``scope``; ``armed`` is what
        the last call returned (None at first). Either the scope's own deadline is set, or
        ``fire()`` will be called, never before ``when`` but possibly at an earlier
        deadline still armed: ``fire`` compares the time with the deadline it wants and
        cancels the scope, or calls this again. Returns what to pass as ``armed`` next."""

    def now(self) -> float:
        """The loop's clock (the ``when`` of :meth:`deadline`)."""

    def watch(self, fn: Callable[[], Awaitable[None]], after: float) -> Callable[[], None]:
        """Run ``fn()`` beside the caller, from ``after`` seconds on, in no task group (it
        must not raise); returns what stops it (before it started: it never starts)."""

    def fd_reader(self, fd: int, drain: Callable[[], None]) -> FdReader: ...


def backend() -> Backend:
    """The :class:`Backend` of the running event loop."""
    name = sniffio.current_async_library()
    if name == "asyncio":
        loop = asyncio.get_running_loop()
        found = _asyncio_backends.get(loop)
        if found is None:
            for old in [lp for lp in _asyncio_backends if lp.is_closed()]:
                del _asyncio_backends[old]  # loops come and go in tests
            found = _asyncio_backends[loop] = _Asyncio(loop)
        return found
    if name == "trio":
        return _TRIO
    raise RuntimeError(f"bls runs on asyncio or trio, not {name}")


# -- asyncio ------------------------------------------------------------------------------


class Timers:
    """Many callbacks at given loop times on one loop timer (asyncio).

    Callbacks share 1 ms buckets, and the loop timer is armed for the earliest bucket
    only: adding and removing are a dict and a set operation. A callback runs up to 1 ms
    after its time, never before.
    """

    __slots__ = ("_armed", "_buckets", "_handle", "_keys", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._buckets: dict[int, set[Callable[[], object]]] = {}
        self._keys: list[int] = []  # a heap of bucket keys (ms of loop time)
        self._armed = 0  # the key the loop timer is armed for; 0: none
        self._handle: asyncio.TimerHandle | None = None

    def add(self, when: float, fn: Callable[[], object]) -> int:
        """Call ``fn`` once at loop time ``when`` (finite); returns the key :meth:`remove`
        takes."""
        return self.add_key(math.ceil(when * 1000), fn)

    def add_key(self, key: int, fn: Callable[[], object]) -> int:
        """:meth:`add` for the bucket ``key`` (the millisecond of loop time, rounded up)."""
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


class _Future:
    """A :class:`Waiter` on an asyncio future."""

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


class _Asyncio:
    name = "asyncio"

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.timers = Timers(loop)
        self.cancel_scope = _scope_maker()

    def waiter(self) -> Waiter:
        return _Future(self.loop)

    def deadline(
        self, scope: anyio.CancelScope, when: float, armed: Any, fire: Callable[[], object]
    ) -> int | None:
        # A deadline moved later keeps the timer armed (fire() checks again then): most
        # move later (the body's deadline, then the request's) and few ever fire.
        timers = self.timers
        if when == math.inf:
            if armed is not None:
                timers.remove(armed, fire)
            return None
        key = math.ceil(when * 1000)
        if armed is not None:
            if armed <= key:
                return int(armed)
            timers.remove(armed, fire)
        return timers.add_key(key, fire)

    def now(self) -> float:
        return self.loop.time()

    def watch(self, fn: Callable[[], Awaitable[None]], after: float) -> Callable[[], None]:
        # A bare task: one per request in a task group costs more than the rest of a small
        # request, and the watcher needs none of a group's guarantees.
        loop, timers = self.loop, self.timers
        started: list[asyncio.Task[None]] = []

        def start() -> None:
            started.append(loop.create_task(fn()))  # type: ignore[arg-type]

        key = timers.add(loop.time() + after, start)

        def stop() -> None:
            timers.remove(key, start)
            if started:
                started[0].cancel()

        return stop

    def fd_reader(self, fd: int, drain: Callable[[], None]) -> FdReader:
        return _AsyncioReader(self.loop, fd, drain)


class _AsyncioReader:
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


# -- trio ---------------------------------------------------------------------------------


class _Trio:
    name = "trio"

    def __init__(self) -> None:
        self._make: Callable[..., anyio.CancelScope] | None = None

    def cancel_scope(self, shield: bool = False) -> anyio.CancelScope:
        if self._make is None:
            self._make = _scope_maker()
        return self._make(shield=shield)

    def waiter(self) -> Waiter:
        return _Event()

    def deadline(
        self, scope: anyio.CancelScope, when: float, armed: Any, fire: Callable[[], object]
    ) -> None:
        scope.deadline = when  # trio's own deadlines are cheap

    def now(self) -> float:
        return anyio.current_time()

    def watch(self, fn: Callable[[], Awaitable[None]], after: float) -> Callable[[], None]:
        import trio

        stopper = trio.CancelScope()

        async def watcher() -> None:
            with stopper:
                await trio.sleep(after)
                await fn()

        trio.lowlevel.spawn_system_task(watcher)
        return stopper.cancel

    def fd_reader(self, fd: int, drain: Callable[[], None]) -> FdReader:
        return _TrioReader(fd, drain)


class _Event:
    """A :class:`Waiter` on an anyio Event."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = anyio.Event()

    async def wait(self) -> None:
        await self._event.wait()

    def wake(self) -> bool:
        self._event.set()
        return True


class _TrioReader:
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


def _scope_maker() -> Callable[..., anyio.CancelScope]:
    """The class of the running backend's cancel scopes (anyio's public class makes one
    of these, looking the backend up first): called with ``shield=``, it makes one."""
    return type(anyio.CancelScope())


_TRIO = _Trio()
_asyncio_backends: dict[asyncio.AbstractEventLoop, _Asyncio] = {}
