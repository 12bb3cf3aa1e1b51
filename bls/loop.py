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
- :meth:`Backend.delays`: keys due a fixed delay after they were added (a body too slow,
  a request that now needs its disconnect watcher): the order added is the order due, so
  a dict and one loop timer serve them all.
- :meth:`Backend.spawn`: a task in no group (the disconnect watcher).
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
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, Protocol, TypeVar

import anyio
import anyio.lowlevel
import sniffio

__all__ = ["Backend", "Delays", "FdReader", "Timers", "Waiter", "backend"]

log = logging.getLogger("bls")

K = TypeVar("K", bound=Hashable)
K_in = TypeVar("K_in", bound=Hashable, contravariant=True)

# How late a due key may be handed over (its loop timer is armed no more often).
_DELAY_STEP = 0.001


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


class Delays(Protocol[K_in]):
    """Keys that come due ``delay`` seconds after they were added: ``fire(key)`` runs for
    each key still there then (up to a millisecond late, never early), in the order they
    were added. A key is either waiting or not: adding it again restarts its delay."""

    def add(self, key: K_in) -> None: ...

    def discard(self, key: K_in) -> None:
        """Forget ``key`` (nothing if it is not waiting)."""


class Backend(Protocol):
    """What bls needs of an event loop beyond anyio."""

    name: str

    def cancel_scope(self, shield: bool = False) -> anyio.CancelScope:
        """A new ``anyio.CancelScope``: the same object, made without looking up the
        running backend (``anyio.CancelScope()`` does that each time: more than half its
        cost on a request's path)."""

    def waiter(self) -> Waiter: ...
    def fd_reader(self, fd: int, drain: Callable[[], None]) -> FdReader: ...

    def deadline(
        self, scope: anyio.CancelScope, when: float, armed: Any, fire: Callable[[], object]
    ) -> Any:
        """Make loop time ``when`` (inf: none) the deadline of ``scope``; ``armed`` is what
        the last call returned (None at first). Either the scope's own deadline is set, or
        ``fire()`` will be called by ``when`` (up to a millisecond late), possibly sooner (at
        an earlier deadline still armed, or up to a second early for a distant one):
        ``fire`` compares the time with the deadline it wants and cancels the scope, or
        calls this again. Returns what to pass as ``armed`` next."""

    def now(self) -> float:
        """The loop's clock (the ``when`` of :meth:`deadline`)."""

    def delays(self, delay: float, fire: Callable[[K], object]) -> Delays[K]:
        """A new :class:`Delays` calling ``fire`` (which must not raise) on this loop."""

    def spawn(self, fn: Callable[[], Awaitable[None]]) -> Callable[[], object]:
        """Run ``fn()`` beside the caller in no task group (it must not raise); returns
        what stops it."""


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


class _Due(Generic[K]):
    """Both backends' :class:`Delays`: a backend's ``_started(when)`` sees to a hand-over
    at ``when`` when none is on its way."""

    __slots__ = ("_clock", "_delay", "_due", "_fire")

    def __init__(self, clock: Callable[[], float], delay: float, fire: Callable[[K], object]):
        self._clock = clock
        self._delay = delay
        self._fire = fire
        self._due: dict[K, float] = {}  # key -> when, in the order added: the order due

    def add(self, key: K) -> None:
        self._due.pop(key, None)  # added again: due later, so last in order
        when = self._due[key] = self._clock() + self._delay
        self._started(when)

    def discard(self, key: K) -> None:
        self._due.pop(key, None)

    def _started(self, when: float) -> None: ...

    def _fire_due(self, now: float) -> float | None:
        """Hand over the keys due by ``now``; when the next one is due (None: none)."""
        due = self._due
        while due:
            key = next(iter(due))
            when = due[key]
            if when > now:
                return when
            del due[key]
            try:
                self._fire(key)
            except Exception:  # one key's bug must not stop the others
                log.exception("a delayed callback failed")
        return None


class _AsyncioDelays(_Due[K]):
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
            self._handle = self._loop.call_at(max(when, now + _DELAY_STEP), self._run)


class _TrioDelays(_Due[K]):
    """:class:`Delays` on a system task that runs while keys wait."""

    __slots__ = ("_running",)

    def __init__(self, delay: float, fire: Callable[[K], object]) -> None:
        super().__init__(anyio.current_time, delay, fire)
        self._running = False

    def _started(self, when: float) -> None:
        import trio

        if not self._running:
            self._running = True
            trio.lowlevel.spawn_system_task(self._run)

    async def _run(self) -> None:
        try:
            now = anyio.current_time()
            when = self._fire_due(now)
            while when is not None:  # (keys wait until due: no event to wait for instead)
                await anyio.sleep_until(max(when, now + _DELAY_STEP))
                now = anyio.current_time()
                when = self._fire_due(now)
        finally:
            self._running = False


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
        # A deadline moved later keeps the timer armed (fire() checks again then), and one
        # more than a second away is filed under its whole second, early (fire() arms it
        # again then, to the millisecond): a server holds a deadline minutes away for each
        # request, and a bucket per millisecond until then would be 1,000 sets a second.
        timers = self.timers
        if when == math.inf:
            if armed is not None:
                timers.remove(armed, fire)
            return None
        if when - self.loop.time() > 1.0:
            key = math.floor(when) * 1000
        else:
            key = math.ceil(when * 1000)
        if armed is not None:
            if armed <= key:
                return int(armed)
            timers.remove(armed, fire)
        return timers.add_key(key, fire)

    def now(self) -> float:
        return self.loop.time()

    def delays(self, delay: float, fire: Callable[[K], object]) -> Delays[K]:
        return _AsyncioDelays(self.loop, delay, fire)

    def spawn(self, fn: Callable[[], Awaitable[None]]) -> Callable[[], object]:
        # A bare task: one per request in a task group costs more than the rest of a small
        # request, and the watcher needs none of a group's guarantees.
        return self.loop.create_task(fn()).cancel  # type: ignore[arg-type]

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

    def delays(self, delay: float, fire: Callable[[K], object]) -> Delays[K]:
        return _TrioDelays(delay, fire)

    def spawn(self, fn: Callable[[], Awaitable[None]]) -> Callable[[], object]:
        import trio

        stopper = trio.CancelScope()

        async def task() -> None:
            with stopper:
                await fn()

        trio.lowlevel.spawn_system_task(task)
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
