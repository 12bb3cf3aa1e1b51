"""Testing the chat endpoint with bls.testing and the official openai client: FakeLLM
answers in place of the engine.

    python -m pytest examples/chat/test_chat.py
"""

import openai
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
