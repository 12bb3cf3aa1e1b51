"""Typed LLM calls: the constraint a type becomes, bls.ask and tools against FakeLLM (which
honours constraints), typed and untyped, on both backends."""

from __future__ import annotations

import enum
import random
import re
from typing import Annotated, Any, Literal

import anyio
import msgspec
import pytest

import bls
from bls import stage, testing
from bls.constraints import MAX_INTEGER, MAX_ITEMS, MAX_LENGTH, constraint_for
from bls.conversation import conversation
from bls.models.fake_outputs import regex_sample, satisfying
from bls.models.vllm import GenerateItem, GenerateRequest

pytestmark = pytest.mark.anyio


class Verdict(bls.Message):
    ok: bool
    reason: Annotated[str, msgspec.Meta(max_length=20)]


class Calc(bls.Message):
    """Evaluate an arithmetic expression."""

    expression: Annotated[str, msgspec.Meta(max_length=16)]


class Lookup(bls.Message):
    key: str


class Mood(enum.Enum):
    HAPPY = "happy"
    SAD = "sad"


calculator = bls.Stage("calculator", Calc, float)
generator = bls.StreamStage("generator", GenerateRequest, GenerateItem)


# -- the constraint a type becomes ----------------------------------------------------


def test_a_message_becomes_a_bounded_json_schema_keeping_its_own_bounds() -> None:
    class Report(bls.Message):
        title: Annotated[str, msgspec.Meta(max_length=8)]
        body: str
        tags: list[str]
        counts: dict[str, int]
        score: float
        rank: Annotated[int, msgspec.Meta(ge=1, le=5)]

    constraint = constraint_for(Report)
    assert constraint is not None and constraint.kind() == "json"
    schema = (constraint.json or {})["$defs"]["Report"]
    fields = schema["properties"]
    assert schema["additionalProperties"] is False
    assert fields["title"]["maxLength"] == 8 and fields["body"]["maxLength"] == MAX_LENGTH
    assert fields["tags"]["maxItems"] == MAX_ITEMS
    assert fields["tags"]["items"]["maxLength"] == MAX_LENGTH
    assert fields["counts"]["maxProperties"] == MAX_ITEMS
    assert (fields["score"]["minimum"], fields["score"]["maximum"]) == (-1e15, 1e15)
    assert (fields["rank"]["minimum"], fields["rank"]["maximum"]) == (1, 5)
    assert constraint_for(int).json == {  # type: ignore[union-attr]
        "type": "integer",
        "minimum": -MAX_INTEGER,
        "maximum": MAX_INTEGER,
    }


def test_choices_regexes_grammars_and_free_text() -> None:
    assert constraint_for(Literal["a", "b"]) == bls.Constraint(choice=["a", "b"])
    assert constraint_for(Mood) == bls.Constraint(choice=["happy", "sad"])
    assert constraint_for(bls.Regex(r"\d+")) == bls.Constraint(regex=r"\d+")
    assert constraint_for(bls.Grammar('root ::= "x"')) == bls.Constraint(grammar='root ::= "x"')
    assert constraint_for(str) is None
    assert (constraint_for(Literal[1, 2]) or bls.Constraint(json_object=True)).kind() == "json"
    with pytest.raises(ValueError, match="exactly one"):
        bls.Constraint(choice=["a"], regex="a")


# -- bls.ask against FakeLLM ----------------------------------------------------------


@bls.script
async def judge(req: dict[str, Any]) -> Verdict:
    """The README's untyped style: the LLM stage by name."""
    verdict: Verdict = await bls.ask("generator", req["text"], Verdict, seed=req.get("seed"))
    return verdict


@bls.script
async def judge_typed(req: dict[str, Any]) -> Verdict:
    """The same through a typed handle."""
    verdict: Verdict = await bls.ask(generator, req["text"], Verdict, seed=req.get("seed"))
    return verdict


@pytest.mark.parametrize("entry", [judge, judge_typed], ids=["untyped", "typed"])
async def test_ask_returns_the_type_and_sends_the_constraint(entry: bls.Script) -> None:
    with testing.fake({"generator": testing.FakeLLM()}) as calls:
        first = await testing.call(entry, {"text": "is this polite?", "seed": 1})
        again = await testing.call(entry, {"text": "is this polite?", "seed": 1})
    assert isinstance(first, Verdict) and first == again  # deterministic
    sent = calls["generator"][0].request
    assert sent.messages[0].role == "user" and sent.messages[0].text() == "is this polite?"
    assert sent.constraint == constraint_for(Verdict)
    assert sent.max_tokens == bls.llm.MAX_TOKENS and sent.seed == 1
    # Only the end is read: the engine sends the whole answer as one item.
    assert sent.stream is False and len(calls["generator"][0].items) == 1


async def test_ask_takes_choices_regexes_lists_and_conversations() -> None:
    @bls.script
    async def many(req: dict[str, Any]) -> dict[str, Any]:
        messages = [
            bls.ChatMessage(role="system", content="be brief"),
            {"role": "user", "content": "x"},
        ]
        mood = await bls.ask("generator", messages, Mood)
        pick = await bls.ask("generator", "pick", Literal["left", "right"])
        code = await bls.ask("generator", "code", bls.Regex(r"[A-Z]{3}-\d{4}"))
        numbers = await bls.ask("generator", "numbers", list[int])
        free = await bls.ask("generator", "anything", max_tokens=3)
        return {"mood": mood, "pick": pick, "code": code, "numbers": numbers, "free": free}

    with testing.fake({"generator": testing.FakeLLM()}) as calls:
        got = await testing.call(many, {})
    assert isinstance(got["mood"], Mood) and got["pick"] in ("left", "right")
    assert re.fullmatch(r"[A-Z]{3}-\d{4}", got["code"])
    assert isinstance(got["numbers"], list) and all(isinstance(n, int) for n in got["numbers"])
    assert isinstance(got["free"], str) and calls["generator"][-1].request.constraint is None
    assert [m.role for m in calls["generator"][0].request.messages] == ["system", "user"]


async def test_a_regex_and_a_grammar_of_the_same_text_are_each_sent_as_what_they_are() -> None:
    @bls.script
    async def both(req: dict[str, Any]) -> list[str]:
        return [await bls.ask("generator", "x", kind(r"[A-Z]+")) for kind in req["kinds"]]

    replies = testing.FakeLLM(testing.FakeOptions(replies=["ABC"]))
    with testing.fake({"generator": replies}) as calls:
        assert await testing.call(both, {"kinds": [bls.Regex, bls.Grammar]}) == ["ABC", "ABC"]
    sent = [call.request.constraint for call in calls["generator"]]
    assert sent == [bls.Constraint(regex=r"[A-Z]+"), bls.Constraint(grammar=r"[A-Z]+")]


async def test_an_output_that_is_not_the_type_names_the_stage_and_the_field() -> None:
    bad = testing.FakeLLM(testing.FakeOptions(replies=['{"ok":"yes","reason":"x"}']))
    with testing.fake({"generator": bad}), pytest.raises(bls.StageError) as failed:
        await testing.call(judge, {"text": "t"})
    assert failed.value.kind == "invalid_response" and failed.value.stage == "generator"
    assert "Verdict" in failed.value.message and "$.ok" in failed.value.message


async def test_an_output_cut_at_max_tokens_says_so() -> None:
    @bls.script
    async def short(req: dict[str, Any]) -> Verdict:
        return await bls.ask("generator", "judge", Verdict, max_tokens=2)  # type: ignore[no-any-return]

    with testing.fake({"generator": testing.FakeLLM()}), pytest.raises(bls.StageError) as failed:
        await testing.call(short, {})
    assert failed.value.kind == "invalid_response"
    assert "stopped at max_tokens=2" in failed.value.message


async def test_cancelling_an_ask_aborts_the_generation() -> None:
    slow = testing.FakeLLM(testing.FakeOptions(tpot_ms=50))

    @bls.script
    async def bounded(req: dict[str, Any]) -> str:
        with anyio.move_on_after(0.2):
            await bls.ask("generator", "judge", Verdict)
        return "moved on"

    with testing.fake({"generator": slow}):
        assert await testing.call(bounded, {}) == "moved on"
    assert slow.aborted == 1 and slow.unfinished() == 0


# -- tools ----------------------------------------------------------------------------

TOOL_THEN_ANSWER = [
    '{"tool":"calculator","arguments":{"expression":"2+2"}}',
    '{"answer":{"ok":true,"reason":"it is 4"}}',
]


@bls.script
async def agent(req: dict[str, Any]) -> dict[str, Any]:
    messages: list[Any] = [{"role": "user", "content": req["question"]}]
    tools = [calculator, bls.Tool("lookup", Lookup, "find a value")]
    steps = []
    for _ in range(4):
        reply = await bls.ask("generator", messages, Verdict, tools=tools)
        if not isinstance(reply, bls.ToolCall):
            return {"answer": reply, "steps": steps}
        steps.append(reply.name)
        result = await stage(reply.name, reply.arguments)
        messages += [reply.message(), reply.result(result)]
    return {"answer": None, "steps": steps}


async def test_a_tool_call_is_typed_and_its_result_goes_back() -> None:
    llm = testing.FakeLLM(testing.FakeOptions(replies=TOOL_THEN_ANSWER))

    async def calculate(req: Calc) -> float:
        assert isinstance(req, Calc)  # the call's arguments arrive typed
        return 4.0

    with testing.fake({"generator": llm, "calculator": calculate}) as calls:
        got = await testing.call(agent, {"question": "2+2?"})
    assert got == {"answer": Verdict(ok=True, reason="it is 4"), "steps": ["calculator"]}
    first, second = calls["generator"]
    assert [t["function"]["name"] for t in first.request.tools] == ["calculator", "lookup"]
    assert first.request.tools[0]["function"]["description"] == "Evaluate an arithmetic expression."
    said = conversation(second.request.messages)
    assert [m["role"] for m in said] == ["user", "assistant", "tool"]
    assert said[1]["tool_calls"][0]["function"] == {
        "name": "calculator",
        "arguments": {"expression": "2+2"},
    }
    assert msgspec.json.decode(said[1]["content"]) == {
        "tool": "calculator",
        "arguments": {"expression": "2+2"},
    }
    assert said[2]["content"] == "4.0" and said[2]["tool_call_id"] == said[1]["tool_calls"][0]["id"]


async def test_fakellm_picks_tools_that_exist_with_arguments_that_decode() -> None:
    async def calculate(req: Calc) -> float:
        return 1.0

    async def lookup(req: Lookup) -> str:
        return "v"

    for seed in range(8):
        with testing.fake(
            {"generator": testing.FakeLLM(), "calculator": calculate, "lookup": lookup}
        ):
            got = await testing.call(agent, {"question": f"q{seed}"})
        assert set(got["steps"]) <= {"calculator", "lookup"}
        assert got["answer"] is None or isinstance(got["answer"], Verdict)


async def test_a_tool_that_was_not_offered_is_an_invalid_response() -> None:
    llm = testing.FakeLLM(testing.FakeOptions(replies=['{"tool":"rm","arguments":{}}']))
    with testing.fake({"generator": llm}), pytest.raises(bls.StageError, match="none of the tools"):
        await testing.call(agent, {"question": "x"})


# -- FakeLLM under constraints --------------------------------------------------------


@pytest.mark.parametrize(
    "pattern",
    [r"[A-Z]{3}-\d{4}", r"(yes|no), [^a-z]+\s\w{2,4}", r"^a.b$", r"(ab)\1c?", r"\D\W\S+"],
)
def test_fakellm_writes_what_a_regex_matches(pattern: str) -> None:
    rng = random.Random(0)
    for _ in range(20):
        assert re.fullmatch(pattern, regex_sample(pattern, rng))


def test_fakellm_writes_values_of_a_schema_and_refuses_a_grammar() -> None:
    class Nested(bls.Message):
        items: list[Verdict]
        mood: Mood
        size: Annotated[float, msgspec.Meta(gt=0, lt=1)]
        note: str | None = None

    constraint = constraint_for(Nested)
    assert constraint is not None
    for seed in range(30):
        value = msgspec.json.decode(satisfying(constraint, random.Random(seed)), type=Nested)
        assert 0 < value.size < 1
    with pytest.raises(bls.InvalidRequest, match="cannot follow a grammar"):
        satisfying(bls.Constraint(grammar="root ::= x"), random.Random(0))


def test_bls_check_sees_the_stages_an_ask_and_a_tool_name(tmp_path: Any) -> None:
    """A script whose LLM stage is named only in bls.ask still has it bound by config."""
    from bls.check import find_stage_uses

    script = tmp_path / "s.py"
    script.write_text(
        "import bls\nfrom bls import ask\n"
        "async def f(req):\n"
        "    tools = [bls.Tool('lookup', dict)]\n"
        "    await bls.ask('generator', 'q', int, tools=tools)\n"
        "    await ask('judge', 'q')\n"
    )
    uses = {(u.name, u.streaming) for u in find_stage_uses(script)}
    assert uses == {("generator", True), ("judge", True), ("lookup", False)}
