"""Testing hello's retry loop with bls.testing: no bls.toml, no workers, no models.

python -m pytest examples/test_hello.py
"""

import anyio
import pytest
from hello import Answer, Ask, Draft, Verdict, hello

import bls
from bls import testing

pytestmark = pytest.mark.anyio

REJECT = Verdict(ok=False, reason="too short")
ACCEPT = Verdict(ok=True, reason="fine")


def draft(req: Draft) -> str:
    return f"{req.prompt} #{req.attempt}"


async def test_the_judge_rejects_twice_then_accepts() -> None:
    with testing.fake({"draft": draft, "judge": [REJECT, REJECT, ACCEPT]}) as calls:
        answer = await testing.call(hello, Ask(text="hi"))

    assert answer == Answer(text="hi #3", attempts=3, accepted=True, reasons=["too short"] * 2)
    assert [c.request.attempt for c in calls["draft"]] == [1, 2, 3]
    assert [c.request for c in calls["judge"]] == ["hi #1", "hi #2", "hi #3"]


async def test_it_gives_up_after_max_attempts() -> None:
    with testing.fake({"draft": draft, "judge": REJECT}) as calls:
        answer = await testing.call(hello, Ask(text="hi", max_attempts=2))

    assert not answer.accepted and answer.attempts == 2
    assert len(calls["judge"]) == 2


async def test_the_deadline_runs_out_mid_loop() -> None:
    async def slow_judge(text: str) -> Verdict:
        if text.endswith("#2"):
            await anyio.sleep(10)  # the request's deadline passes here
        return REJECT

    with testing.fake({"draft": draft, "judge": slow_judge}) as calls:
        with pytest.raises(bls.DeadlineExceeded):
            await testing.call(hello, Ask(text="hi"), timeout=0.2)

    first, second = calls["judge"]
    assert not first.cancelled and second.cancelled  # the second judging was cut short
    assert second.duration < 5
    assert "draft" in calls and len(calls["draft"]) == 2  # no third attempt


async def test_a_failing_judge_fails_the_request() -> None:
    overloaded = bls.StageError("judge", "overloaded", "no capacity")
    with testing.fake({"draft": draft, "judge": overloaded}):
        with pytest.raises(bls.StageError) as caught:
            await testing.call(hello, Ask(text="hi"))
    assert caught.value.stage == "judge" and caught.value.kind == "overloaded"
