"""One request's scope (frontend, ``bls run``, worker): its deadline ends it, a cancel
ends it before, as and while it runs but never after, and the context its stage calls
carry (deadline, trace, span) is set inside it and undone after."""

from __future__ import annotations

import math
import time

import anyio
import pytest

import bls
from bls.bindings import Binding
from bls.runtime import Runtime
from bls.scope import NO_CONTEXT, CallContext, Reason, RequestScope, current
from bls.tracing import Trace

pytestmark = pytest.mark.anyio


async def test_the_deadline_ends_the_scope_and_says_so() -> None:
    scope = RequestScope("r")
    scope.expire_after(0.01)
    async with scope:
        await anyio.sleep(5)
    assert scope.cancelled_caught and scope.reason is Reason.DEADLINE


async def test_a_cancel_before_it_starts_ends_it_as_it_starts() -> None:
    scope = RequestScope("r")
    scope.cancel(Reason.DRAIN)  # a drain reached it before it started
    async with scope:
        await anyio.sleep(5)
    assert scope.cancelled_caught and scope.reason is Reason.DRAIN


async def test_a_cancel_from_another_task_ends_it() -> None:
    scope = RequestScope("r")
    async with anyio.create_task_group() as tg:

        async def request() -> None:
            async with scope:
                await anyio.sleep(5)

        tg.start_soon(request)
        await anyio.sleep(0.01)
        scope.cancel(Reason.CLIENT_GONE)
    assert scope.cancelled_caught and scope.reason is Reason.CLIENT_GONE


async def test_a_cancel_after_it_ended_does_nothing() -> None:
    scope = RequestScope("r")
    scope.expire_after(5)
    async with scope:
        await anyio.lowlevel.checkpoint()
    scope.cancel(Reason.DRAIN)  # a drain reached it while it sent its answer
    await anyio.sleep(0.01)
    assert not scope.cancelled_caught and scope.reason is None


async def test_the_deadline_can_move_while_it_runs() -> None:
    # The frontend's body deadline, then the request's own.
    scope = RequestScope("r")
    scope.expire_after(0.01)
    async with scope:
        scope.expire_after(5)
        await anyio.sleep(0.05)
        scope.expire_after(0.01)
        await anyio.sleep(5)
    assert scope.reason is Reason.DEADLINE


async def test_stage_calls_inside_carry_the_deadline_and_trace_and_nothing_after() -> None:
    trace = Trace("r", "entry")
    root = trace.open("entry", 0, "script")
    scope = RequestScope("r", trace=trace, span=root)
    assert current() is NO_CONTEXT
    async with scope:
        inside = current()
        assert inside.trace is trace and inside.parent == root.id
        assert inside.deadline == math.inf and inside.wire_deadline == 0.0
        scope.expire_after(30)  # set inside: calls made from now on carry it
        assert time.time() + 29 < current().deadline <= time.time() + 30
        async with bls.timeout(1):  # a script's timeout lowers it, for its block only
            assert current().deadline <= time.time() + 1
        assert current().deadline > time.time() + 29
    assert current() is NO_CONTEXT


async def test_expire_at_takes_an_absolute_deadline_as_a_frame_carries_it() -> None:
    scope = RequestScope("r")
    scope.expire_at(time.time() + 0.02)
    started = anyio.current_time()
    async with scope:
        await anyio.sleep(5)
    assert scope.reason is Reason.DEADLINE and anyio.current_time() - started < 2


async def test_a_callers_deadline_is_carried_but_not_raised() -> None:
    soon = time.time() + 1
    scope = RequestScope("r", carried=soon)
    scope.expire_after(60)  # its own deadline is later: calls still carry the caller's
    async with scope:
        assert current().deadline == soon


class _Recorder(Binding):
    """A binding that records the context it was handed."""

    def __init__(self) -> None:
        self.name = "rec"
        self.description = "recorder"
        self.signature = bls.messages.signature_of(_rec)
        self.seen: list[CallContext] = []

    async def call(self, req: object, ctx: CallContext = NO_CONTEXT) -> object:
        self.seen.append(ctx)
        return req


async def _rec(req: str) -> str:
    return req


async def test_the_runtime_hands_each_call_its_context_explicitly() -> None:
    rec = _Recorder()

    @bls.script
    async def entry(req: str) -> str:
        async with bls.timeout(10):
            return await bls.stage("rec", req)

    async with Runtime({"rec": rec}) as rt:
        # bls run's path: a timeout of its own, no trace.
        assert await rt.run(entry, "a", timeout=60) == "a"
        ctx = rec.seen[-1]
        assert ctx.trace is None and time.time() < ctx.deadline <= time.time() + 10
        # The frontend's path: a traced request; the call is handed its own span.
        trace = Trace("r", "entry")
        root = trace.open("entry", 0, "script")
        async with RequestScope("r", trace=trace, span=root):
            assert await rt.run(entry, "b") == "b"
        ctx = rec.seen[-1]
        assert ctx.trace is trace and ctx.span is not None
        assert ctx.span.name == "rec" and ctx.span.parent == root.id
        assert ctx.span.outcome == "ok"


async def test_a_cancel_from_inside_just_before_it_ends_does_not_outlive_it() -> None:
    """A worker's call that cancels its own scope as it finishes (its reply could not be
    sent: the caller is gone) and returns without awaiting: the cancel must end with the
    scope, not strike the task at its next await (which killed a worker's lane, and with
    it the worker's whole task group)."""
    for before in (False, True):
        scope = RequestScope("r")
        if before:
            scope.cancel(Reason.CALLER_CANCELLED)  # a cancel frame came before it started
        async with scope:
            if not before:
                scope.cancel(Reason.CALLER_LOST)
        await anyio.sleep(0.01)  # must not raise: the task is not cancelled
        assert scope.reason is not Reason.DEADLINE


# -- one cancellation model: the request scope behaves as trio's CancelScope ---------------


async def test_a_request_scope_is_single_use() -> None:
    scope = RequestScope("r")
    async with scope:
        pass
    with pytest.raises(RuntimeError, match="single use"):
        async with scope:
            pass


async def test_leaving_out_of_order_or_from_another_task_raises() -> None:
    outer, inner = RequestScope("outer"), RequestScope("inner")
    await outer.__aenter__()
    await inner.__aenter__()
    with pytest.raises(RuntimeError):
        await outer.__aexit__(None, None, None)  # the inner one is still open
    await inner.__aexit__(None, None, None)

    scope = RequestScope("r")
    await scope.__aenter__()
    failed: list[BaseException] = []

    async def leave_elsewhere() -> None:
        try:
            await scope.__aexit__(None, None, None)
        except RuntimeError as exc:
            failed.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(leave_elsewhere)
    assert failed, "a scope left from another task must raise"


async def test_a_shield_inside_a_request_keeps_its_work_from_the_requests_cancel() -> None:
    """The worker closes a stream in a shielded block while its call is cancelled: the
    shield holds, whether the cancel is the deadline or an explicit one."""
    for cancel in (False, True):
        scope = RequestScope("r")
        finished = False
        async with scope:
            if cancel:
                scope.cancel(Reason.CALLER_CANCELLED)
            else:
                scope.expire_after(0.01)
            with anyio.CancelScope(shield=True):
                await anyio.sleep(0.05)  # past the deadline, or after the cancel
                finished = True
            await anyio.sleep(5)  # here it ends
        expected = Reason.CALLER_CANCELLED if cancel else Reason.DEADLINE
        assert finished and scope.cancelled_caught and scope.reason is expected


async def test_a_shielded_request_scope_ignores_the_cancel_around_it() -> None:
    with anyio.CancelScope() as outer:
        outer.cancel()
        async with RequestScope("r", shield=True) as inner:
            await anyio.sleep(0.01)  # not cancelled: shielded
        assert not inner.cancelled_caught
        await anyio.sleep(5)
    assert outer.cancelled_caught


async def test_a_deadline_removed_or_moved_later_does_not_fire() -> None:
    scope = RequestScope("r")
    scope.expire_after(0.01)
    async with scope:
        scope.expire_after(None)  # --request-timeout 0: no deadline after all
        await anyio.sleep(0.05)
        scope.expire_after(10)
        await anyio.sleep(0.02)
    assert not scope.cancelled_caught


async def test_a_nan_deadline_is_refused_as_trio_refuses_it() -> None:
    scope = RequestScope("r")
    for set_it in (scope.expire_at, scope.expire_after):
        with pytest.raises(ValueError, match="a deadline must be a time or infinite, not NaN"):
            set_it(math.nan)
    with pytest.raises(ValueError, match="not NaN"):
        RequestScope("r", timeout=math.nan)
    scope.expire_at(math.inf)  # none: still fine
    async with scope:
        await anyio.sleep(0.001)
    assert not scope.cancelled_caught


async def test_a_request_run_inside_another_keeps_the_callers_priority() -> None:
    seen: list[int] = []

    async def note(req: int) -> int:
        seen.append(current().priority)
        return req

    @bls.script
    async def inner(req: int) -> int:
        return await bls.stage("note", req)

    async with Runtime({"note": note}) as rt:
        with bls.priority(5):
            await rt.run(inner, 1, timeout=1)  # (a scope of its own: the timeout)
            await rt.run(inner, 2)
    assert seen == [5, 5]


async def test_the_first_reason_given_is_the_one_told() -> None:
    scope = RequestScope("r")
    async with scope:
        scope.cancel(Reason.CLIENT_GONE)
        scope.cancel(Reason.DRAIN)  # (a drain reached it after its client left)
        await anyio.sleep(5)
    assert scope.reason is Reason.CLIENT_GONE
    untouched = RequestScope("r")
    async with untouched:
        pass
    assert untouched.reason is None
