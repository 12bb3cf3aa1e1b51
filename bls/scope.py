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
  cancels (a disconnect, a cancel frame, a drain), sets the request's CallContext for
  everything inside it, and closes the stage streams the request left open.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from typing import Any

import anyio

from .loop import Backend
from .loop import backend as current_backend
from .tracing import Span, Trace, outcome_of

__all__ = [
    "LATEST_DEADLINE",
    "NO_CONTEXT",
    "CallContext",
    "OpenStreams",
    "Reason",
    "RequestScope",
    "current",
    "enter",
    "leave",
    "traced_call",
    "traced_stream",
]

log = logging.getLogger("bls")

# The latest deadline a frame carries, in epoch seconds (the year 5138): a later one, from
# a timeout of 1e12 s say, is sent as none; one a peer sends past it is refused.
LATEST_DEADLINE = 1e11
CLOSE_S = 5.0  # how long the streams a request left open get to close when it ends


class Reason(enum.Enum):
    """Why a request's scope ended what ran in it (:attr:`RequestScope.reason`): its
    deadline, or whoever cancelled it, saying why. One table in each server maps a reason
    to what its client is told (an HTTP status, a worker's error frame)."""

    DEADLINE = "deadline"  # its deadline passed
    CLIENT_GONE = "client gone"  # its HTTP client went away
    BODY_TOO_SLOW = "body too slow"  # its HTTP body did not arrive within the bound
    DRAIN = "drain"  # the server's drain ran out of grace
    CALLER_CANCELLED = "caller cancelled"  # a worker's caller cancelled the call
    CALLER_LOST = "caller lost"  # a worker gave up on its caller (silent, or not reading)
    CANCELLED = "cancelled"  # its owner cancelled it (a library user, a test)


class CallContext:
    """What a stage call carries: the deadline, the priority, where its span goes, the
    request's open streams, the request's recording when one is kept (immutable; the
    streams and the recording are the request's own), the HTTP request's headers (a
    served request's: an affinity may be keyed by one), and, for one call, its affinity
    key (:mod:`bls.affinity`)."""

    __slots__ = ("deadline", "headers", "key", "priority", "record", "span", "streams", "trace")

    def __init__(
        self,
        deadline: float = math.inf,
        trace: Trace | None = None,
        span: Span | None = None,
        streams: OpenStreams | None = None,
        record: Any = None,
        priority: int = 0,
        key: bytes | None = None,
        headers: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        self.deadline = deadline  # epoch seconds; inf: none
        self.trace = trace  # None: untraced (the runtime records nothing)
        self.span = span  # the span new calls are children of (None: the trace's root)
        self.streams = streams  # None: outside any request (the runtime's own then)
        self.record = record  # a bls.recording.Recorder, or None
        self.priority = priority  # higher first (bls.priority, X-Priority); 0: the default
        self.key = key  # the replica a call goes to is chosen by it (None: by load)
        self.headers = headers  # (lower-case name, value), as the server read them

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
        return CallContext(
            deadline, self.trace, self.span, self.streams, self.record, self.priority,
            self.key, self.headers,
        )  # fmt: skip

    def under(self, span: Span) -> CallContext:
        """The same, for calls made inside ``span``."""
        return CallContext(
            self.deadline, self.trace, span, self.streams, self.record, self.priority,
            self.key, self.headers,
        )  # fmt: skip

    def at_priority(self, priority: int) -> CallContext:
        """The same, with calls made at ``priority``."""
        return CallContext(
            self.deadline, self.trace, self.span, self.streams, self.record, priority,
            self.key, self.headers,
        )  # fmt: skip

    def keyed(self, key: bytes | None) -> CallContext:
        """The same, for one call whose replica ``key`` chooses (:mod:`bls.affinity`)."""
        return CallContext(
            self.deadline, self.trace, self.span, self.streams, self.record, self.priority,
            key, self.headers,
        )  # fmt: skip

    def __repr__(self) -> str:
        trace = self.trace.id if self.trace is not None else None
        return f"CallContext(deadline={self.deadline}, trace={trace}, parent={self.parent})"


NO_CONTEXT = CallContext()

_context: contextvars.ContextVar[CallContext] = contextvars.ContextVar(
    "bls_call_context", default=NO_CONTEXT
)


# The context stage calls made here carry: ``current()`` (the variable's own ``get``, with
# no Python call around it: each stage call asks).
current: Callable[[], CallContext] = _context.get


def enter(ctx: CallContext) -> contextvars.Token[CallContext]:
    """Make ``ctx`` the context of what runs next in this task; undo with :func:`leave`."""
    return _context.set(ctx)


def leave(token: contextvars.Token[CallContext] | None) -> None:
    """Undo :func:`enter`: in the task, and the order, that entered (else RuntimeError)."""
    if token is not None:
        try:
            _context.reset(token)
        except ValueError:
            raise RuntimeError(
                "a bls scope (a request, bls.timeout) was left from another task or "
                "context than the one that entered it"
            ) from None


class RequestScope:
    """One request's cancel scope: ``async with RequestScope(...)``.

    It is an anyio cancel scope, with trio's semantics on both backends: single use
    (entering it twice raises), left by the task that entered it and in order (anything
    else raises), cancellable before it starts (it then starts cancelled) and never after
    it ended (a drain may reach a request that is still sending its answer), and, given
    ``shield=True``, deaf to the cancels of the scopes around it. ``bls.timeout``, task
    groups and shields inside it nest with it as anyio scopes do.

    ``timeout`` (seconds from now, as it is made), :meth:`expire_at` (absolute, epoch
    seconds, as a frame carries it) or :meth:`expire_after` (relative; None: none) set
    its deadline, before entering or inside, as often as the caller needs, on the
    loop's :class:`bls.loop.Deadline` (on asyncio the shared timers, or a server's
    shared delay; on trio the scope's own). NaN is refused, as trio refuses it.
    :meth:`cancel` ends it early, from any task of its loop, with a :class:`Reason`; once
    it has ended, :attr:`reason` says why (the deadline, or the first reason given), one
    value for whoever answers the request to map to what its client is told.

    Inside, the request's :class:`CallContext` is current: that deadline (or ``carried``,
    a caller's earlier one that the caller's own scopes enforce), ``trace``, ``span`` and
    ``record`` (a :class:`bls.recording.Recorder`), so every stage call carries them. A
    stage stream the request opened and left open (a loop left with ``break``, an
    exception) is closed as the scope ends: a remote worker is told to stop, its span is
    closed.
    """

    __slots__ = (
        "_backend",
        "_carried",
        "_deadline",
        "_exited",
        "_reason",
        "_scope",
        "_token",
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
        shield: bool = False,
        backend: Backend | None = None,
        record: Any = None,
        priority: int = 0,
        timeout: float | None = None,
        headers: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        self.id = request_id
        self._carried = _not_nan(carried)
        self._backend = backend or current_backend()  # a server that knows it passes it
        self._scope = self._backend.cancel_scope(shield=shield)
        self._deadline = self._backend.deadline(self._scope)
        self._token: contextvars.Token[CallContext] | None = None
        self._exited = False
        self._reason: Reason | None = None  # why it was cancelled (the first reason given)
        deadline = carried
        if timeout is not None and math.isfinite(_not_nan(timeout)):  # (made at once)
            deadline = min(carried, time.time() + timeout)
            self._deadline.after(timeout)
        self.ctx = CallContext(
            deadline, trace, span, OpenStreams(), record, priority, None, headers
        )

    def expire_at(self, wall: float) -> None:
        """Set the deadline to ``wall`` (epoch seconds; inf: none). ValueError for NaN,
        as trio's scopes refuse it."""
        self._carry(_not_nan(wall))
        if not self._exited:
            if wall == math.inf:
                self._deadline.clear()
            else:
                self._deadline.at(self._backend.now() + (wall - time.time()))

    def expire_after(self, seconds: float | None) -> None:
        """Set the deadline ``seconds`` from now (None: none; ValueError for NaN)."""
        if seconds is None:
            self._carry(math.inf)
            if not self._exited:
                self._deadline.clear()
            return
        self._carry(time.time() + _not_nan(seconds))
        if not self._exited:
            self._deadline.after(seconds)

    def _carry(self, wall: float) -> None:
        """The deadline stage calls carry from now on (a cancel stays a cancel)."""
        ctx = self.ctx
        self.ctx = CallContext(
            min(wall, self._carried), ctx.trace, ctx.span, ctx.streams, ctx.record, ctx.priority,
            headers=ctx.headers,
        )  # fmt: skip
        if self._token is not None and not self._exited:
            _context.set(self.ctx)  # this task's context, undone on exit with the rest

    def cancel(self, reason: Reason) -> None:
        """Cancel the request now, saying why; before it starts, as it starts; after it
        ends, never. The first reason given is the one :attr:`reason` tells."""
        if self._reason is None:
            self._reason = reason
        if not self._exited:
            self._scope.cancel()

    @property
    def backend(self) -> Backend:
        """The :class:`bls.loop.Backend` of the event loop the request runs on."""
        return self._backend

    @property
    def cancelled_caught(self) -> bool:
        """Whether the scope ended what ran inside it (a deadline or a cancel)."""
        return self._scope.cancelled_caught

    @property
    def cancelling(self) -> Reason | None:
        """Why what runs in the scope is being cancelled, while it is (code that cleans
        up may differ by it): the reason given, or :attr:`Reason.DEADLINE`; None when it
        is not being cancelled."""
        if not self._scope.cancel_called:
            return None
        return self._reason or Reason.DEADLINE

    @property
    def reason(self) -> Reason | None:
        """Why the scope ended what ran in it, once it has: the reason it was cancelled
        for, or :attr:`Reason.DEADLINE`; None when what ran ended by itself."""
        if not self._scope.cancelled_caught:
            return None
        return self._reason or Reason.DEADLINE

    async def __aenter__(self) -> RequestScope:
        if self._token is not None or self._exited:
            raise RuntimeError(
                f"request scope {self.id!r} was entered already: a RequestScope is single use"
            )
        self._scope.__enter__()
        self._token = _context.set(self.ctx)
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        self._exited = True
        self._deadline.clear()
        streams = self.ctx.streams
        if streams:
            await streams.aclose()
        try:
            leave(self._token)
        finally:
            swallowed = bool(self._scope.__exit__(exc_type, exc, tb))
        return swallowed


def _not_nan(value: float) -> float:
    if math.isnan(value):
        raise ValueError("a deadline must be a time or infinite, not NaN")
    return value


class OpenStreams(set[Any]):
    """The stage streams a request has open. A stream adds itself when it starts and
    removes itself when it ends; what is left when the request ends is closed then."""

    async def aclose(self) -> None:
        """Close every stream left open (shielded, bounded: a stream's own ``finally``
        that hangs does not hold the request)."""
        with anyio.move_on_after(CLOSE_S, shield=True):
            while self:
                stream = self.pop()
                try:
                    await stream.aclose()
                except Exception:  # its error already went to whoever read it, or no one
                    log.debug("a stream left open failed as it was closed", exc_info=True)


# -- traced stage calls -----------------------------------------------------------------


async def traced_call(
    ctx: CallContext,
    name: str,
    description: str,
    invoke: Callable[[Any, CallContext], Coroutine[Any, Any, Any]],
    req: Any,
) -> Any:
    """``invoke(req, ctx)`` (a binding's) inside a span of its own: the binding is handed
    the span, and stage calls made meanwhile (an inline script's) become its children."""
    trace = ctx.trace
    assert trace is not None
    # (ctx.parent, ctx.under(span) and what _inside does, written out: this is per call)
    span = trace.open(name, 0 if ctx.span is None else ctx.span.id, description)
    inner = CallContext(
        ctx.deadline, trace, span, ctx.streams, ctx.record, ctx.priority, headers=ctx.headers
    )
    token = _context.set(inner)
    try:
        result = await invoke(req, inner)
    except BaseException as exc:
        trace.close(span, *outcome_of(exc))
        raise
    finally:
        _context.reset(token)
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

    async def aclose(self) -> None:
        span, trace = self._span, self._ctx.trace
        if span is not None and not span.end and trace is not None:
            trace.close(span, "cancelled", "closed early")
        close = getattr(self._it, "aclose", None)
        if close is not None:
            await close()  # a remote stream's cancel is filed under its span, which it holds
