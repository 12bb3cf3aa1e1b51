"""One request's scope, the same for an HTTP request (``bls serve``), ``bls run`` and an
incoming call in ``bls worker``: its id, deadline, cancellation and trace.

Two halves:

- :class:`CallContext` is what every stage call made inside a request carries: the
  absolute deadline (sent to remote workers, so they stop on time even if a cancel is
  lost) and the trace and span the call records under. It lives in one context variable,
  because scripts call ``stage()`` without passing anything; the runtime reads it once
  per stage call and hands it to the binding, so the transport is given the deadline and
  trace and never reads context variables itself. ``bls.timeout`` and each traced call
  set a narrower one for what runs inside them.
- :class:`RequestScope` is the cancel scope that enforces the deadline and takes the
  cancels (a disconnect, a cancel frame, a drain), and sets the request's CallContext for
  everything inside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import heapq
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any

import anyio
import sniffio

from .tracing import Span, Trace, outcome_of

__all__ = [
    "LATEST_DEADLINE",
    "NO_CONTEXT",
    "CallContext",
    "RequestScope",
    "Timers",
    "current",
    "enter",
    "leave",
    "timers",
    "traced_call",
    "traced_stream",
]

log = logging.getLogger("bls")

# The latest deadline a frame carries, in epoch seconds (the year 5138): a later one, from
# a timeout of 1e12 s say, is sent as none; one a peer sends past it is refused.
LATEST_DEADLINE = 1e11


class CallContext:
    """What a stage call carries: the deadline and where its span goes (immutable)."""

    __slots__ = ("deadline", "span", "trace")

    def __init__(
        self, deadline: float = math.inf, trace: Trace | None = None, span: Span | None = None
    ) -> None:
        self.deadline = deadline  # epoch seconds; inf: none
        self.trace = trace  # None: untraced (the runtime records nothing)
        self.span = span  # the span new calls are children of (None: the trace's root)

    @property
    def parent(self) -> int:
        return 0 if self.span is None else self.span.id

    @property
    def wire_deadline(self) -> float:
        """The deadline as a frame carries it (0: none; so is one past
        :data:`LATEST_DEADLINE`, which no request lives to see)."""
        return 0.0 if self.deadline >= LATEST_DEADLINE else self.deadline

    def within(self, deadline: float) -> CallContext:
        """The same, with the deadline lowered to ``deadline`` (never raised)."""
        if deadline >= self.deadline:
            return self
        return CallContext(deadline, self.trace, self.span)

    def under(self, span: Span) -> CallContext:
        """The same, for calls made inside ``span``."""
        return CallContext(self.deadline, self.trace, span)

    def __repr__(self) -> str:
        trace = self.trace.id if self.trace is not None else None
        return f"CallContext(deadline={self.deadline}, trace={trace}, parent={self.parent})"


NO_CONTEXT = CallContext()

_context: contextvars.ContextVar[CallContext] = contextvars.ContextVar(
    "bls_call_context", default=NO_CONTEXT
)


def current() -> CallContext:
    """The context stage calls made here carry."""
    return _context.get()


def enter(ctx: CallContext) -> contextvars.Token[CallContext]:
    """Make ``ctx`` the context of what runs next in this task; undo with :func:`leave`."""
    return _context.set(ctx)


def leave(token: contextvars.Token[CallContext] | None) -> None:
    if token is not None:
        try:
            _context.reset(token)
        except ValueError:  # set in another context: leave that context alone
            pass


class Timers:
    """Many callbacks at given loop times on one loop timer (asyncio).

    A server holds a deadline for every request in flight and moves most of them before
    they fire; a loop timer for each costs more than the rest of a small request (on
    uvloop, a libuv timer started and stopped). Here callbacks share 1 ms buckets, and
    the loop timer is armed for the earliest bucket only: adding and removing are a dict
    and a set operation. A callback runs up to 1 ms after its time, never before.
    """

    __slots__ = ("_armed", "_buckets", "_handle", "_keys", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._buckets: dict[int, set[Callable[[], object]]] = {}
        self._keys: list[int] = []  # a heap of bucket keys (ms of loop time)
        self._armed = 0  # the key the loop timer is armed for; 0: none
        self._handle: asyncio.TimerHandle | None = None

    @staticmethod
    def key(when: float) -> int:
        """The bucket of loop time ``when`` (finite): its millisecond, rounded up."""
        return math.ceil(when * 1000)

    def add(self, when: float, fn: Callable[[], object]) -> int:
        """Call ``fn`` once at loop time ``when`` (finite); returns the key :meth:`remove`
        takes."""
        key = self.key(when)
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


_timers: dict[asyncio.AbstractEventLoop, Timers] = {}


def timers(loop: asyncio.AbstractEventLoop) -> Timers:
    """The :class:`Timers` of ``loop`` (made on first use, forgotten with the loop)."""
    found = _timers.get(loop)
    if found is None:
        if len(_timers) > 8:  # loops come and go in tests: drop the closed ones
            for old in [lp for lp in _timers if lp.is_closed()]:
                del _timers[old]
        found = _timers[loop] = Timers(loop)
    return found


class RequestScope:
    """One request's cancel scope: ``async with RequestScope(...)``.

    :meth:`expire_at` (absolute, epoch seconds, as a frame carries it) or
    :meth:`expire_after` (relative) set its deadline, before entering or inside. Inside,
    the request's :class:`CallContext` is current: that deadline (or ``carried``, a
    caller's earlier one that the caller's own scopes enforce), ``trace`` and ``span``,
    so every stage call carries them. :meth:`cancel` ends it early, from any task of its
    loop; whoever cancels knows why, and :attr:`expired` tells a deadline from a cancel.

    On trio it is anyio's (trio's own) cancel scope. On asyncio it cancels its task
    itself, as ``asyncio.timeout`` does (``Task.cancel``, then ``uncancel`` on the way
    out), on the loop's shared :class:`Timers`, however often the deadline moves: a later
    deadline is noted, and the timer re-armed only if it fires before then. (An anyio
    scope or a loop timer per request costs more there than all the rest of a small
    request.) Code inside still uses anyio; a native cancel reaches it like any.
    """

    __slots__ = (
        "_cancel_called",
        "_cancelling",
        "_carried",
        "_caught",
        "_exited",
        "_fired",
        "_loop",
        "_scope",
        "_task",
        "_timer",
        "_timers",
        "_token",
        "_when",
        "ctx",
        "id",
    )

    def __init__(
        self,
        request_id: str = "",
        *,
        trace: Trace | None = None,
        span: Span | None = None,
        carried: float = math.inf,
        asyncio_loop: bool | None = None,
    ) -> None:
        self.id = request_id
        self._carried = carried
        self.ctx = CallContext(carried, trace, span)
        if asyncio_loop is None:
            asyncio_loop = sniffio.current_async_library() == "asyncio"
        self._scope: anyio.CancelScope | None = None if asyncio_loop else anyio.CancelScope()
        self._loop = asyncio.get_running_loop() if asyncio_loop else None
        self._timers = timers(self._loop) if self._loop is not None else None
        self._task: asyncio.Task[Any] | None = None
        self._cancelling = 0
        self._timer = 0  # the key of the armed timer; 0: none
        self._when = math.inf  # the deadline in loop time (asyncio)
        self._token: contextvars.Token[CallContext] | None = None
        self._exited = self._caught = self._cancel_called = self._fired = False

    def expire_at(self, wall: float) -> None:
        """Set the deadline to ``wall`` (epoch seconds; inf: none)."""
        self._expire(wall, None if wall == math.inf else wall - time.time())

    def expire_after(self, seconds: float | None) -> None:
        """Set the deadline ``seconds`` from now (None: none)."""
        self._expire(math.inf if seconds is None else time.time() + seconds, seconds)

    def _expire(self, wall: float, seconds: float | None) -> None:
        """The cancel scope's deadline, and the one stage calls carry from now on (a
        cancel stays a cancel)."""
        ctx = self.ctx
        self.ctx = CallContext(min(wall, self._carried), ctx.trace, ctx.span)
        if self._token is not None and not self._exited:
            _context.set(self.ctx)  # this task's context, undone on exit with the rest
        if self._scope is not None:
            self._scope.deadline = math.inf if seconds is None else anyio.current_time() + seconds
            return
        assert self._loop is not None and self._timers is not None
        self._when = math.inf if seconds is None else self._loop.time() + seconds
        if self._timer:
            if self._when == math.inf or Timers.key(self._when) < self._timer:
                self._timers.remove(self._timer, self._on_timer)  # none now, or sooner
                self._arm()
        elif self._task is not None and not self._exited:
            self._arm()

    def _arm(self) -> None:
        if self._when != math.inf:
            assert self._timers is not None
            self._timer = self._timers.add(self._when, self._on_timer)
        else:
            self._timer = 0

    def _on_timer(self) -> None:
        self._timer = 0
        if self._loop is not None and self._loop.time() < self._when:
            self._arm()  # the deadline moved later meanwhile
        else:
            self._fire()

    def _fire(self) -> None:
        if self._task is None or self._fired or self._exited:
            return
        if asyncio.current_task() is self._task:
            # The scope's own task, running: ``Task.cancel`` would strike at its next
            # await wherever that is, after the scope if it ends first (and nothing
            # could take the cancel back). Cancel from the loop instead, at that await,
            # and only if it is still inside.
            assert self._loop is not None
            self._loop.call_soon(self._fire)
            return
        self._fired = True
        self._task.cancel()

    def cancel(self) -> None:
        """Cancel the request now; before it starts, as it starts; after it ends, never
        (a drain may reach a request that is still sending its answer)."""
        self._cancel_called = True
        if self._scope is not None:
            if not self._exited:
                self._scope.cancel()
        else:
            self._fire()

    @property
    def cancelled_caught(self) -> bool:
        """Whether the scope ended what ran inside it (a deadline or a cancel)."""
        return self._caught

    @property
    def expired(self) -> bool:
        """Whether it was the deadline that ended it."""
        return self._caught and not self._cancel_called

    async def __aenter__(self) -> RequestScope:
        if self._scope is not None:
            self._scope.__enter__()
        else:
            task = self._task = asyncio.current_task()
            assert task is not None
            self._cancelling = task.cancelling()
            if self._cancel_called:
                self._fire()
            else:
                self._arm()
        self._token = _context.set(self.ctx)
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        self._exited = True
        leave(self._token)
        if self._scope is not None:
            swallowed = bool(self._scope.__exit__(exc_type, exc, tb))
            self._caught = self._scope.cancelled_caught
            return swallowed
        if self._timer:
            assert self._timers is not None
            self._timers.remove(self._timer, self._on_timer)
            self._timer = 0
        if self._fired:
            assert self._task is not None
            # Ours, unless someone else cancelled the task as well (as asyncio.timeout).
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                self._caught = True
                return True
        return False


# -- traced stage calls -----------------------------------------------------------------


async def traced_call(
    ctx: CallContext,
    name: str,
    description: str,
    call: Callable[[CallContext], Coroutine[Any, Any, Any]],
) -> Any:
    """``call(ctx)`` (a binding's invoke) inside a span of its own: the binding is handed
    the span, and stage calls made meanwhile (an inline script's) become its children."""
    assert ctx.trace is not None
    trace = ctx.trace
    span = trace.open(name, ctx.parent, description)
    inner = ctx.under(span)
    with _inside(trace, span, inner):
        result = await call(inner)
    trace.close(span, "ok")
    return result


@contextlib.contextmanager
def _inside(trace: Trace, span: Span, ctx: CallContext) -> Iterator[None]:
    """Run a step of ``span``; an exception ends it with the matching outcome."""
    token = _context.set(ctx)
    try:
        yield
    except StopAsyncIteration:
        trace.close(span, "ok")
        raise
    except BaseException as exc:
        trace.close(span, *outcome_of(exc))
        raise
    finally:
        _context.reset(token)


class traced_stream:
    """A stage stream inside a span that runs from the first item asked to the last;
    ``open(ctx)`` (a binding's stream) is handed the span when the first item is asked."""

    __slots__ = ("_ctx", "_description", "_inner", "_it", "_name", "_open", "_span")

    def __init__(
        self,
        ctx: CallContext,
        name: str,
        description: str,
        open: Callable[[CallContext], AsyncIterator[Any]],
    ) -> None:
        assert ctx.trace is not None
        self._ctx = ctx
        self._name = name
        self._description = description
        self._open = open
        self._it: AsyncIterator[Any] | None = None
        self._span: Span | None = None
        self._inner = ctx

    def __aiter__(self) -> traced_stream:
        return self

    async def __anext__(self) -> Any:
        trace = self._ctx.trace
        assert trace is not None
        span = self._span
        if span is None:
            span = self._span = trace.open(self._name, self._ctx.parent, self._description, True)
            self._inner = self._ctx.under(span)
        if span.end:
            raise StopAsyncIteration
        with _inside(trace, span, self._inner):
            if self._it is None:
                self._it = self._open(self._inner)
            item = await self._it.__anext__()
        span.items += 1
        return item

    def _closed_early(self) -> None:
        span = self._span
        trace = self._ctx.trace
        if span is not None and not span.end and trace is not None:
            trace.close(span, "cancelled", "closed early")

    def __del__(self) -> None:
        # A script that leaves ``async for`` with ``break`` drops the stream without
        # closing it: its span still ends, and reaches the metrics.
        self._closed_early()

    async def aclose(self) -> None:
        self._closed_early()
        close = getattr(self._it, "aclose", None)
        if close is not None:
            await close()  # a remote stream's cancel is filed under its span, which it holds
