"""Testing the agent with bls.testing: FakeLLM in place of the engine (it honours the
structured-output constraint, or answers given replies), the real tools beside it.

    python -m pytest examples/agent/test_agent.py
"""

import anyio
import pytest
from agent import STEP_S, Calc, Outcome, Question, Reply, agent
from tools import calculate, lookup

from bls import testing

pytestmark = pytest.mark.anyio

MARS = '{"tool":"lookup","arguments":{"key":"moons of mars"}}'
JUPITER = '{"tool":"lookup","arguments":{"key":"Moons of  Jupiter"}}'
ADD = '{"tool":"calculator","arguments":{"expression":"2 + 95"}}'
ANSWER = '{"answer":{"answer":"97 moons"}}'


def llm(*replies: str, **options: float) -> testing.FakeLLM:
    return testing.FakeLLM(testing.FakeOptions(replies=list(replies), **options))


TOOLS = {"calculator": calculate, "lookup": lookup}


async def test_tools_run_and_their_results_go_back_until_an_answer() -> None:
    engine = llm(MARS, JUPITER, ADD, ANSWER)
    with testing.fake({"llm": engine, **TOOLS}) as calls:
        outcome = await testing.call(agent, Question(question="moons of mars and jupiter?"))

    assert outcome.ended == "answer" and outcome.answer == "97 moons"
    assert [(s.tool, s.result) for s in outcome.steps] == [
        ("lookup", {"value": "2", "error": None}),
        ("lookup", {"value": "95", "error": None}),
        ("calculator", {"value": 97.0, "error": None}),
    ]
    assert calls["calculator"][0].request == Calc(expression="2 + 95")  # typed arguments
    last = calls["llm"][-1].request.messages
    # The question, then the two latest exchanges (call, result): the oldest dropped out.
    assert [m.role for m in last] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert last[-1].content == '{"value":97.0,"error":null}'


async def test_the_step_budget_ends_the_loop() -> None:
    with testing.fake({"llm": llm(MARS), **TOOLS}):
        outcome = await testing.call(agent, {"question": "?", "max_steps": 3})
    assert outcome == Outcome(answer=None, steps=outcome.steps, ended="step budget")
    assert len(outcome.steps) == 3


async def test_too_little_of_the_deadline_left_ends_the_loop() -> None:
    with testing.fake({"llm": llm(ANSWER), **TOOLS}) as calls:
        outcome = await testing.call(agent, {"question": "?"}, timeout=STEP_S / 2)
    assert outcome.ended == "deadline" and "llm" not in calls


async def test_any_reply_the_constraint_admits_runs_to_a_well_formed_outcome() -> None:
    for seed in range(10):
        with testing.fake({"llm": testing.FakeLLM(), **TOOLS}):
            outcome = await testing.call(agent, {"question": "?", "seed": seed})
        assert outcome.ended in ("answer", "step budget")
        assert all(step.tool in TOOLS for step in outcome.steps)


async def test_cancelling_the_request_cancels_the_generation_in_flight() -> None:
    engine = llm(ANSWER, tpot_ms=100)
    with testing.fake({"llm": engine, **TOOLS}):
        with anyio.move_on_after(0.2):
            await testing.call(agent, {"question": "?"})
    assert engine.aborted == 1 and engine.unfinished() == 0


async def test_cancelling_the_request_cancels_the_tool_in_flight() -> None:
    started, cancelled = anyio.Event(), anyio.Event()

    async def slow_lookup(req: dict) -> dict:
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.set()

    with testing.fake({"llm": llm(MARS), "calculator": calculate, "lookup": slow_lookup}):
        async with anyio.create_task_group() as tg:
            tg.start_soon(testing.call, agent, {"question": "?"})
            await started.wait()
            tg.cancel_scope.cancel()
    assert cancelled.is_set()


def test_the_answer_type_bounds_what_the_model_may_write() -> None:
    from bls.constraints import constraint_for

    constraint = constraint_for(Reply)
    assert constraint is not None and constraint.json is not None
    assert constraint.json["$defs"]["Reply"]["properties"]["answer"]["maxLength"] == 64
