"""bls.policy: each knob checked with an error naming the stage and the field, the retry
budget's arithmetic, hedge delays from recent latencies, and bls.remaining()."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import anyio
import pytest

import bls
from bls.policy import Latencies, PolicyError, PolicyState, RetryBudget, policy_from
from bls.scope import CallContext
from transport import attempts


def test_the_defaults_repeat_nothing_and_eject_after_five_failures() -> None:
    policy = policy_from("gen", {})
    assert not policy.repeats and policy.hedge is None and policy.retry is None
    assert policy.eject.failures == 5 and policy.eject.for_ms == 1000


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"retry": {}},
            "stage 'gen': retry would send a call more than once, and the stage is not "
            "declared idempotent",
        ),
        (
            {"hedge": {"after_ms": 5}, "retry": {}},
            "stage 'gen': hedge and retry would send a call more than once",
        ),
        ({"idempotent": True, "hedge": {}}, "stage 'gen': hedge: give one of after_ms or after"),
        (
            {"idempotent": True, "hedge": {"after_ms": 5, "after": "p90"}},
            "give one of after_ms or after",
        ),
        (
            {"idempotent": True, "hedge": {"after": "p100"}},
            "hedge.after: expected p50 to p99, got 'p100'",
        ),
        ({"idempotent": True, "hedge": {"after": "95"}}, "expected p50 to p99, got '95'"),
        ({"idempotent": True, "hedge": {"after_ms": 0}}, "hedge.after_ms: Expected `float` >"),
        ({"idempotent": True, "hedge": {"after_ms": 5, "max": 9}}, "hedge.max: Expected `int`"),
        ({"idempotent": True, "retry": {"attempts": 0}}, "retry.attempts: Expected `int` >= 1"),
        ({"idempotent": True, "retry": {"budget": 2}}, "retry.budget: Expected `float` <= 1"),
        (
            {"idempotent": True, "retry": {"on": ["invalid_request"]}},
            "retry.on: invalid_request: the request caused it, and would cause it again",
        ),
        ({"eject": {"failure": 3}}, "Object contains unknown field `failure`"),
        ({"eject": {"max_fraction": 0}}, "eject.max_fraction: Expected `float` > 0"),
        ({"idempotent": "yes"}, "idempotent: Expected `bool`, got `str`"),
    ],
)
def test_a_bad_policy_names_the_stage_and_the_field(fields: dict, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        policy_from("gen", fields)
    assert str(caught.value).startswith("stage 'gen': ")
    assert message in str(caught.value)


def test_a_typed_handle_checks_its_policy_where_it_is_written() -> None:
    class Req(bls.Message):
        n: int

    line = sys._getframe().f_lineno + 2  # the handle's own line, where the fix goes
    with pytest.raises(PolicyError) as caught:
        bls.Stage("gen", Req, Req, hedge={"after_ms": 20})
    assert str(caught.value) == (
        f"{__file__}:{line}: bls.Stage('gen', ...): stage 'gen': hedge would send a call "
        "more than once, and the stage is not declared idempotent: add `idempotent=True` if "
        "running a call twice is safe"
    )
    handle = bls.Stage("gen", Req, Req, idempotent=True, retry={"attempts": 2})
    assert handle.policy is not None and handle.policy.retry is not None
    assert handle.policy.retry.attempts == 2
    assert bls.Stage("gen", Req, Req).policy is None


def test_a_quantile_hedge_waits_for_enough_calls_then_follows_them() -> None:
    hedge = policy_from("gen", {"idempotent": True, "hedge": {"after": "p90"}}).hedge
    assert hedge is not None
    latencies = Latencies()
    for ms in range(1, Latencies.MIN_SAMPLES):
        latencies.add(ms / 1000)
    assert hedge.delay(latencies) is None  # too few to know the stage's p90
    for ms in range(Latencies.MIN_SAMPLES, 101):
        latencies.add(ms / 1000)
    assert hedge.delay(latencies) == pytest.approx(0.091)
    fixed = policy_from("gen", {"idempotent": True, "hedge": {"after_ms": 20}}).hedge
    assert fixed is not None and fixed.delay(latencies) == 0.02


def test_the_retry_budget_allows_its_fraction_of_calls_and_a_floor() -> None:
    budget = RetryBudget(0.1, floor_per_s=0)
    assert not budget.withdraw()  # no calls yet: nothing saved up
    for _ in range(25):
        budget.deposit()
    assert [budget.withdraw() for _ in range(3)] == [True, True, False]  # 10 % of 25

    floored = RetryBudget(0.0, floor_per_s=2)
    assert [floored.withdraw() for _ in range(3)] == [True, True, False]


def test_the_retry_budget_caps_what_a_quiet_time_saves() -> None:
    budget = RetryBudget(0.5, floor_per_s=0, cap=3)
    for _ in range(100):
        budget.deposit()
    assert sum(budget.withdraw() for _ in range(10)) == 3


@pytest.mark.anyio
async def test_remaining_is_the_earliest_deadline_and_none_without_one() -> None:
    assert bls.remaining() is None
    async with bls.timeout(5):
        left = bls.remaining()
        assert left is not None and 4 < left <= 5
        async with bls.timeout(0.5):
            inner = bls.remaining()
            assert inner is not None and 0 < inner <= 0.5
        with bls.timeout(60):  # a later deadline inside does not extend the outer one
            later = bls.remaining()
            assert later is not None and later <= 5
    with pytest.raises(bls.DeadlineExceeded):
        async with bls.timeout(0.01):
            await anyio.sleep(0.05)
    async with bls.timeout(0):
        assert bls.remaining() == 0.0


class _DeadlineEverywhere:
    """A stand-in replica set for the attempts: two live replicas, and every copy of the
    call told by its worker that the deadline passed (after a moment, so a copy is sent)."""

    description = "stand-in"

    def __init__(self) -> None:
        self.policy = policy_from("work", {"idempotent": True, "hedge": {"after_ms": 1}})
        self.state = PolicyState(self.policy)
        self.connections = [SimpleNamespace(alive=True, retired=False) for _ in range(2)]
        self.copies = 0

    async def answer(self, body: list, ctx: CallContext, busy: list | None = None) -> list:
        self.copies += 1
        await anyio.sleep(0.02)
        raise bls.DeadlineExceeded("stage 'work': the deadline passed in the worker")


@pytest.mark.anyio
async def test_a_hedged_call_whose_copies_see_the_deadline_pass_raises_deadline_exceeded() -> None:
    """As a call without copies does: not an exception group from the copies' task group."""
    replicas = _DeadlineEverywhere()
    with pytest.raises(bls.DeadlineExceeded, match="deadline passed in the worker"):
        await attempts.call(replicas, [], CallContext())  # type: ignore[arg-type]
    assert replicas.copies == 2 and replicas.state.counts.hedges == 1


class _Copies:
    """A stand-in replica set whose copies answer after the given delays, in order."""

    description = "stand-in"

    def __init__(self, *delays: float, max_copies: int = 1) -> None:
        fields = {"idempotent": True, "hedge": {"after_ms": 10, "max": max_copies}}
        self.policy = policy_from("work", fields)
        self.state = PolicyState(self.policy)
        self.connections = [SimpleNamespace(alive=True, retired=False) for _ in range(3)]
        self.delays = list(delays)

    async def answer(self, body: list, ctx: CallContext, busy: list | None = None) -> list:
        n = len(busy or []) if busy is not None else 0
        if busy is not None:
            busy.append(self.connections[n])
        await anyio.sleep(self.delays[n])
        return [f"copy {n}".encode()]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("delays", "won", "cancelled"),
    [
        ((1.0, 0.0), 1, 0),  # the copy wins: the original is cancelled, no copy is
        ((0.03, 1.0), 0, 1),  # the original wins after the copy went: the copy is cancelled
        ((1.0, 1.0, 0.0), 1, 1),  # the second copy wins: the first copy is cancelled
    ],
)
async def test_hedges_cancelled_counts_copies_that_lost(
    delays: tuple[float, ...], won: int, cancelled: int
) -> None:
    replicas = _Copies(*delays, max_copies=len(delays) - 1)
    await attempts.call(replicas, [], CallContext())  # type: ignore[arg-type]
    sent = replicas.state.counts.hedges
    assert (sent, replicas.state.counts.hedges_won, replicas.state.counts.hedges_cancelled) == (
        len(delays) - 1,
        won,
        cancelled,
    )
