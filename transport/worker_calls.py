"""A call inside the worker: its state, the request scope it runs in, how it ends.

Each call runs under a :class:`bls.scope.RequestScope` carrying the caller's absolute
deadline, so a call stops on time even if the cancel frame never arrives; a streaming
call sends items as the caller's credit allows. However it ends — a result, an error,
the caller's cancel, its deadline, a caller given up on, a drain's grace run out — the
caller gets one final frame that says which (:class:`CallRunner`).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import anyio
import msgspec

from bls.bindings import Binding
from bls.errors import ErrorKind, InvalidRequest, StageError
from bls.scope import CallContext, Reason, RequestScope
from bls.tracing import Span, Trace, outcome_of

from . import wire
from .wire import Kind

__all__ = ["CUT_SHORT", "CallRunner", "CallState", "Replies", "WorkerStats", "undecodable"]

log = logging.getLogger("bls.worker")


class WorkerStats(msgspec.Struct):
    """Counters a worker keeps; ``dropped`` counts malformed or unexpected frames."""

    calls: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    deadline: int = 0
    rejected: int = 0
    dropped: int = 0
    too_large: int = 0
    read_stalls: int = 0  # input found waiting with no wake-up coming (and then read)


class CallState:
    """One call the worker has taken: whose, how much stream credit it has, and, once it
    is cut short, why (:meth:`cut`)."""

    __slots__ = (
        "client",
        "credit",
        "deadline",
        "id",
        "key",
        "lost",
        "priority",
        "reason",
        "request",
        "scope",
        "trace",
        "wake",
    )

    def __init__(
        self,
        client: bytes,
        call_id: int,
        credit: int,
        request: Any = None,
        deadline: float = 0.0,
        priority: int = 0,
    ) -> None:
        self.client = client
        self.id = call_id
        self.key = (client, call_id)
        self.credit = credit
        self.request = request  # decoded, until it starts
        self.deadline = deadline  # epoch seconds; 0: none
        self.priority = priority
        self.wake: anyio.Event | None = None
        self.scope: RequestScope | None = None
        self.reason: Reason | None = None  # why it was cut short before it started
        self.lost = ""  # why the worker gave up on the caller, if it did
        self.trace: Trace | None = None

    def cut(self, reason: Reason) -> bool:
        """Cut the call short: cancel it if it runs, else remember why for when it would
        start. Whether it was running."""
        if self.reason is None:
            self.reason = reason
        if self.scope is not None:
            self.scope.cancel(reason)
            return True
        return False


# How a call its scope ended is answered (the one table from a reason to an error frame):
# its error kind and message.
CUT_SHORT: dict[Reason, tuple[str, str]] = {
    Reason.DEADLINE: (ErrorKind.DEADLINE, "the call's deadline passed"),
    Reason.CALLER_CANCELLED: (ErrorKind.CANCELLED, "cancelled by the caller"),
    Reason.CALLER_LOST: (ErrorKind.UNAVAILABLE, "the worker gave up on the caller"),
    Reason.DRAIN: (ErrorKind.SHUTDOWN, "the worker shut down before the call ended"),
}


class Replies(Protocol):
    """How a call's frames reach its caller (the :class:`.worker_server.WorkerServer`)."""

    def data(self, state: CallState, body: list[Any]) -> None:
        """One stream item."""

    def final(self, state: CallState, kind: int, body: list[Any] | None = None) -> None:
        """The END or ERROR frame, with the spans the call recorded."""

    def ended(self, state: CallState) -> None:
        """The call is over: forget it (after its final frame)."""


class CallRunner:
    """Runs calls of one stage's binding, each in its own request scope."""

    def __init__(
        self,
        binding: Binding,
        stage: str,
        stats: WorkerStats,
        replies: Replies,
    ) -> None:
        self.binding = binding
        self.stage = stage
        self.stats = stats
        self.replies = replies
        self.replica = ""  # the address the caller reached, for its spans (once bound)
        self._response = wire.Codec()

    async def run(self, state: CallState) -> None:
        """Run one call in its request scope: the caller's deadline ends it, and its stage
        calls carry it, the caller's trace and its priority."""
        req, deadline, priority = state.request, state.deadline, state.priority
        state.request = None  # (held by the call from here)
        trace, span = state.trace, None
        if trace is not None:
            # The worker's own span; its nested stage calls become its children.
            span = trace.open(self.stage, 0, f"worker {self.binding.description}")
            span.replica = self.replica
        scope = state.scope = RequestScope(
            trace.id if trace is not None else "", trace=trace, span=span, priority=priority
        )
        if deadline:
            scope.expire_at(deadline)
        if state.reason is not None:
            scope.cancel(state.reason)
        try:
            async with scope:
                await self._answer(state, req, span, scope)
            if scope.cancelled_caught:
                kind, why = self._cut_short(state, scope.reason)
                _close(state, span, kind)
                # Acknowledges the cancel; the caller has usually moved on already.
                self._error(state, StageError(self.stage, kind, why))
        finally:
            self.replies.ended(state)

    async def _answer(
        self, state: CallState, req: Any, span: Span | None, scope: RequestScope
    ) -> None:
        """The result or the items, then END; or the stage's error."""
        try:
            if self.binding.signature.streaming:
                await self._stream(state, req, span, scope.ctx)
            else:
                result = await self.binding.call(req, scope.ctx)
                body = self._encode(result)
                _close(state, span, "ok")
                self.replies.final(state, Kind.END, body)
            self.stats.completed += 1
        except StageError as err:
            self.stats.failed += 1
            request = scope.id or "-"
            log.warning("stage %r: request %s: %s: %s", self.stage, request, err.kind, err.message)
            _close(state, span, *outcome_of(err))
            self._error(state, err)

    def _cut_short(self, state: CallState, reason: Reason | None) -> tuple[str, str]:
        """The kind and message of a call its scope ended before it answered
        (:data:`CUT_SHORT`), counted."""
        reason = reason or Reason.DEADLINE
        kind, why = CUT_SHORT[reason]
        if reason is Reason.DEADLINE:
            self.stats.deadline += 1
        else:
            self.stats.cancelled += 1
        return kind, state.lost or why

    def _error(self, state: CallState, err: StageError) -> None:
        self.replies.final(state, Kind.ERROR, [wire.encode_error(wire.error_info(err))])

    def _encode(self, value: Any) -> list[Any]:
        try:
            return self._response.encode(value)
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            why = f"cannot send the result: {exc}"
            raise StageError(self.stage, ErrorKind.INVALID_RESPONSE, why) from None

    async def _stream(
        self, state: CallState, req: Any, span: Span | None, ctx: CallContext
    ) -> None:
        items = self.binding.stream(req, ctx)
        try:
            async for item in items:
                while state.credit <= 0:
                    state.wake = anyio.Event()
                    await state.wake.wait()
                state.credit -= 1
                self.replies.data(state, self._encode(item))
                if span is not None:
                    span.items += 1
        finally:
            with anyio.CancelScope(shield=True):
                await items.aclose()  # type: ignore[attr-defined]
        _close(state, span, "ok")
        self.replies.final(state, Kind.END)


def undecodable(stage: str, exc: Exception) -> InvalidRequest:
    """The answer to a call whose payload could not be decoded."""
    if isinstance(exc, (msgspec.ValidationError, msgspec.DecodeError)):
        return InvalidRequest.from_validation(stage, exc)
    if isinstance(exc, RecursionError):
        return InvalidRequest(stage, "the request is nested too deeply", mismatch=True)
    return InvalidRequest(stage, f"the request cannot be decoded: {exc}", mismatch=True)


def _close(state: CallState, span: Span | None, outcome: str, kind: str = "") -> None:
    if span is not None and state.trace is not None and not span.end:
        state.trace.close(span, outcome, kind)
