"""Cache-aware routing for LLM stages: FakeLLM's simulated prefix cache (what it holds,
what it says it held), and the prefix key that keeps a conversation's turns together."""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
import pytest

import bls
from bls.affinity import key_of
from bls.models.fakellm import FakeLLM, FakeOptions
from bls.models.vllm import GenerateItem, GenerateRequest, prefix_key
from bls.policy import policy_from

pytestmark = pytest.mark.anyio

SYSTEM = {"role": "system", "content": "you are terse " * 8}


def turns(first: str, n: int) -> list[list[dict[str, str]]]:
    """The requests of a conversation of ``n`` turns: each the whole conversation so far."""
    messages = [SYSTEM, {"role": "user", "content": first}]
    asked = [list(messages)]
    for i in range(1, n):
        messages += [
            {"role": "assistant", "content": f"answer {i} " * 10},
            {"role": "user", "content": f"and then {i}?"},
        ]
        asked.append(list(messages))
    return asked


async def first_item(llm: FakeLLM, messages: list[dict[str, str]]) -> GenerateItem:
    req = GenerateRequest(messages=[bls.ChatMessage(**m) for m in messages], max_tokens=1)
    items = [item async for item in llm(req)]
    return items[0]


async def test_a_conversations_next_turn_finds_its_prefix_cached() -> None:
    llm = FakeLLM(FakeOptions(prefix_cache=1000, block_tokens=4))
    conversation = turns("what is two and two", 3)
    first = await first_item(llm, conversation[0])
    assert first.cached_tokens == 0 and first.prompt_tokens
    second = await first_item(llm, conversation[1])
    # Every whole block of the first prompt is cached; only what follows is new.
    assert second.cached_tokens == first.prompt_tokens // 4 * 4
    third = await first_item(llm, conversation[2])
    assert third.cached_tokens == second.prompt_tokens // 4 * 4
    other = await first_item(llm, turns("something else entirely", 1)[0])
    assert other.cached_tokens == 24  # the shared system prompt's blocks only (24 words)


async def test_the_cache_keeps_what_it_can_hold_and_none_without_one() -> None:
    small = FakeLLM(FakeOptions(prefix_cache=2, block_tokens=4))
    prompt = turns("a question", 1)[0]
    await first_item(small, prompt)
    assert (await first_item(small, prompt)).cached_tokens == 0  # its first blocks went out
    none = FakeLLM(FakeOptions())
    await first_item(none, prompt)
    assert (await first_item(none, prompt)).cached_tokens == 0


def test_a_conversations_turns_share_one_key_and_another_conversation_has_its_own() -> None:
    keys = {prefix_key({"messages": m}) for m in turns("what is two and two", 4)}
    assert len(keys) == 1
    assert prefix_key({"messages": turns("what is three", 1)[0]}) not in keys
    typed = GenerateRequest(
        messages=[bls.ChatMessage(**m) for m in turns("what is two and two", 1)[0]]
    )
    assert prefix_key(typed) in keys  # typed or untyped alike
    assert prefix_key({"prompt": "x" * 5000}) == b"x" * 1024
    assert prefix_key({"token_ids": list(range(1000))}) == prefix_key(
        {"token_ids": list(range(256))}
    )
    assert prefix_key({"prompt_embeds": [[0.0]]}) is None


def test_an_llm_stage_routes_by_prefix_through_its_affinity_function() -> None:
    fields: dict[str, Any] = {"affinity": {"function": "bls.models.vllm:prefix_key"}}
    affinity = policy_from("generator", fields).affinity
    assert affinity is not None
    one, two = turns("hello there", 2)
    assert key_of(affinity, {"messages": one}) == key_of(affinity, {"messages": two})


async def test_the_whole_answer_as_one_item_says_what_was_cached_too() -> None:
    llm = FakeLLM(FakeOptions(prefix_cache=1000, block_tokens=4))
    messages = [bls.ChatMessage(**m) for m in turns("what is two and two", 1)[0]]
    for _ in range(2):
        req = GenerateRequest(messages=messages, max_tokens=3, stream=False)
        (whole,) = [item async for item in llm(req)]
    assert whole.prompt_tokens and whole.cached_tokens == whole.prompt_tokens // 4 * 4


@pytest.mark.parametrize("lanes", [0, 1])
async def test_with_one_prefill_lane_a_prompt_waits_for_the_one_before_it(lanes: int) -> None:
    # A long prompt (300 tokens at 1 ms each) begins its prefill, then a short one comes.
    llm = FakeLLM(FakeOptions(prefill_ms=1, prefill_lanes=lanes))
    first_seen: list[str] = []

    async def ask(name: str, words: int) -> None:
        await first_item(llm, [{"role": "user", "content": "word " * words}])
        first_seen.append(name)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ask, "long", 300)
            await anyio.wait_all_tasks_blocked()  # the long one is prefilling
            assert llm.unfinished() == 1
            tg.start_soon(ask, "short", 3)
    # Prefilled as if alone, the short prompt answers first; in one lane it waits its turn.
    assert first_seen == (["long", "short"] if lanes else ["short", "long"])


def test_a_negative_number_of_prefill_lanes_is_refused() -> None:
    with pytest.raises(msgspec.ValidationError, match=r"prefill_lanes"):
        msgspec.convert({"prefill_lanes": -1}, FakeOptions)
