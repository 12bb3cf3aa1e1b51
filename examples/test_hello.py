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


async def test_short_of_time_it_answers_with_the_last_draft() -> None:
    async def slowish_judge(text: str) -> Verdict:
        await anyio.sleep(0.02)
        return REJECT

    with testing.fake({"draft": draft, "judge": slowish_judge}) as calls:
        answer = await testing.call(hello, Ask(text="hi", max_attempts=100), timeout=0.4)

    # With under ATTEMPT_S of the deadline left, it stops and answers with what it has.
    assert not answer.accepted and answer.reasons[-1] == "out of time"
    assert 2 <= answer.attempts < 100 and answer.text == f"hi #{answer.attempts}"
    assert len(calls["judge"]) == answer.attempts
    assert not any(c.cancelled for c in calls["judge"])  # none was cut short


async def test_a_failing_judge_fails_the_request() -> None:
    overloaded = bls.StageError("judge", "overloaded", "no capacity")
    with testing.fake({"draft": draft, "judge": overloaded}):
        with pytest.raises(bls.StageError) as caught:
            await testing.call(hello, Ask(text="hi"))
    assert caught.value.stage == "judge" and caught.value.kind == "overloaded"


async def test_an_llm_judge_gives_a_typed_verdict() -> None:
    from hello_stages import llm_judge

    replies = ['{"ok":false,"reason":"too flat"}', '{"ok":true,"reason":"warm"}']
    llm = testing.FakeLLM(testing.FakeOptions(replies=replies))
    with testing.fake({"draft": draft, "judge": llm_judge, "generator": llm}) as calls:
        answer = await testing.call(hello, Ask(text="hi"))

    assert answer == Answer(text="hi #2", attempts=2, accepted=True, reasons=["too flat"])
    assert calls["generator"][0].request.constraint.json["$defs"]["Verdict"]["required"] == [
        "ok",
        "reason",
    ]
