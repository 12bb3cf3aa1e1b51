"""Testing the chat endpoint with bls.testing and the official openai client: FakeLLM
answers in place of the engine.

    python -m pytest examples/chat/test_chat.py
"""

import json

import openai
import pydantic
import pytest
from chat import chat

from bls import testing

pytestmark = pytest.mark.anyio

HELLO = [{"role": "user", "content": "say hello"}]


async def test_the_openai_client_gets_usage_and_the_finish_reason() -> None:
    with testing.fake({"generator": testing.FakeLLM()}) as calls:
        async with testing.client("examples/chat/chat.py") as http:
            client = openai.AsyncOpenAI(base_url="http://bls/v1", api_key="-", http_client=http)
            done = await client.chat.completions.create(
                model="tiny", messages=HELLO, max_tokens=5, seed=1
            )

    assert done.choices[0].finish_reason == "length"
    assert done.usage is not None and done.usage.completion_tokens == 5
    assert done.usage.prompt_tokens == 2  # FakeLLM counts words
    (generation,) = calls["generator"]
    assert generation.request.max_tokens == 5 and generation.request.seed == 1


async def test_streamed_chunks_add_up_to_the_answer() -> None:
    with testing.fake({"generator": testing.FakeLLM()}):
        async with testing.client("examples/chat/chat.py") as http:
            client = openai.AsyncOpenAI(base_url="http://bls/v1", api_key="-", http_client=http)
            whole = await client.chat.completions.create(
                model="tiny", messages=HELLO, max_tokens=6, seed=2
            )
            stream = await client.chat.completions.create(
                model="tiny", messages=HELLO, max_tokens=6, seed=2, stream=True
            )
            pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]

    assert "".join(pieces) == whole.choices[0].message.content  # the same words


async def test_an_unknown_model_is_a_404_naming_the_one_served() -> None:
    with testing.fake({"generator": testing.FakeLLM()}):
        async with testing.client("examples/chat/chat.py") as http:
            client = openai.AsyncOpenAI(base_url="http://bls/v1", api_key="-", http_client=http)
            with pytest.raises(openai.NotFoundError, match="tiny"):
                await client.chat.completions.create(model="gpt-9", messages=HELLO)


async def test_the_script_is_a_plain_entry_too() -> None:
    request = {"model": "tiny", "messages": HELLO, "max_tokens": 3}  # or a bls.ChatRequest
    with testing.fake({"generator": testing.FakeLLM(testing.FakeOptions(eos_after=2))}):
        items = await testing.call(chat, request)
    assert [i.finish_reason for i in items] == [None, "stop"]


class Verdict(pydantic.BaseModel):
    ok: bool
    reason: str = pydantic.Field(max_length=20)


CALC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "evaluate an arithmetic expression",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "maxLength": 16}},
            "required": ["expression"],
            "additionalProperties": False,
        },
    },
}


async def test_parse_with_a_pydantic_response_format_gets_a_parsed_value() -> None:
    with testing.fake({"generator": testing.FakeLLM()}) as calls:
        async with testing.client("examples/chat/chat.py") as http:
            client = openai.AsyncOpenAI(base_url="http://bls/v1", api_key="-", http_client=http)
            done = await client.chat.completions.parse(
                model="tiny", messages=HELLO, response_format=Verdict, max_tokens=100
            )
    parsed = done.choices[0].message.parsed
    assert isinstance(parsed, Verdict) and len(parsed.reason) <= 20
    (generation,) = calls["generator"]
    assert generation.request.constraint is not None  # the schema reached the engine
    assert generation.request.constraint.json["properties"]["reason"]["maxLength"] == 20


async def test_a_required_tool_choice_answers_with_tool_calls() -> None:
    with testing.fake({"generator": testing.FakeLLM()}):
        async with testing.client("examples/chat/chat.py") as http:
            client = openai.AsyncOpenAI(base_url="http://bls/v1", api_key="-", http_client=http)
            done = await client.chat.completions.create(
                model="tiny", messages=HELLO, tools=[CALC], tool_choice="required", max_tokens=200
            )
            streamed = await client.chat.completions.create(
                model="tiny",
                messages=HELLO,
                tools=[CALC],
                tool_choice={"type": "function", "function": {"name": "calculator"}},
                stream=True,
            )
            deltas = [c.choices[0].delta async for c in streamed if c.choices]
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.function.name == "calculator"
    assert len(json.loads(call.function.arguments)["expression"]) <= 16
    (named,) = [d.tool_calls for d in deltas if d.tool_calls]
    assert named[0].function and named[0].function.name == "calculator"


async def test_several_choices_and_logprobs() -> None:
    with testing.fake({"generator": testing.FakeLLM()}) as calls:
        async with testing.client("examples/chat/chat.py") as http:
            client = openai.AsyncOpenAI(base_url="http://bls/v1", api_key="-", http_client=http)
            done = await client.chat.completions.create(
                model="tiny",
                messages=HELLO,
                n=2,
                seed=5,
                max_tokens=3,
                logprobs=True,
                top_logprobs=2,
            )
    assert [c.index for c in done.choices] == [0, 1]
    assert done.choices[0].message.content != done.choices[1].message.content  # seeds 5, 6
    assert sorted(c.request.seed for c in calls["generator"]) == [5, 6]
    logprobs = done.choices[0].logprobs
    assert logprobs is not None and logprobs.content and len(logprobs.content) == 3
    assert len(logprobs.content[0].top_logprobs) == 2
    assert done.usage is not None and done.usage.completion_tokens == 6


async def test_a_field_bls_cannot_honour_is_a_400_and_an_unknown_one_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with testing.fake({"generator": testing.FakeLLM()}):
        async with testing.client("examples/chat/chat.py") as http:
            client = openai.AsyncOpenAI(base_url="http://bls/v1", api_key="-", http_client=http)
            with pytest.raises(openai.BadRequestError, match="logit_bias is not supported"):
                await client.chat.completions.create(
                    model="tiny", messages=HELLO, logit_bias={"5": 10}
                )
            with caplog.at_level("INFO", logger="bls.http"):
                done = await client.chat.completions.create(
                    model="tiny", messages=HELLO, max_tokens=2, extra_body={"vendor_hint": 1}
                )
    assert done.choices[0].message.content
    assert any("vendor_hint" in r.getMessage() for r in caplog.records)
