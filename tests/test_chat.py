"""The chat endpoint's shapes: what a chat script's items become on the wire."""

from __future__ import annotations

import json

import msgspec
import pytest

import bls
from bls.conversation import conversation
from bls.serve import chat
from bls.serve.framing import ChatChunks


def frames(data: bytes) -> list[dict[str, object] | str]:
    out: list[dict[str, object] | str] = []
    for event in data.decode().split("\n\n"):
        if event:
            payload = event.removeprefix("data: ")
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def test_the_transcript_counts_the_engines_tokens_and_keeps_the_finish_reason() -> None:
    transcript = chat.Transcript()
    assert transcript.add({"text": "a", "token_ids": [1], "prompt_tokens": 7}) == ("a", None)
    assert transcript.add({"text": "", "token_ids": [2]}) == ("", None)
    assert transcript.add({"text": "b", "token_ids": [3], "finish_reason": "length"}) == (
        "b",
        "length",
    )
    assert transcript.usage() == chat.Usage(prompt_tokens=7, completion_tokens=3, total_tokens=10)
    assert transcript.finish_reason == "length"


def test_plain_strings_have_no_usage_to_report() -> None:
    transcript = chat.Transcript()
    assert transcript.add("hello") == ("hello", None)
    assert transcript.usage() is None
    with pytest.raises(TypeError, match="must produce str"):
        transcript.add(3)


def test_stream_chunks_are_openai_chunks() -> None:
    chunks = ChatChunks("chatcmpl-1", 'model "q"')
    body = (
        chunks.role()
        + chunks.text('say "hi"\n')
        + chunks.text("!", "length")
        + chunks.finish("stop")
        + chunks.usage(chat.Usage(1, 2, 3))
        + chunks.done()
    )
    role, text, last, finish, usage, done = frames(body)
    assert isinstance(role, dict) and role["object"] == "chat.completion.chunk"
    assert role["model"] == 'model "q"' and role["id"] == "chatcmpl-1"
    assert role["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
    ]
    assert isinstance(text, dict)
    assert text["choices"] == [
        {"index": 0, "delta": {"content": 'say "hi"\n'}, "finish_reason": None}
    ]
    assert isinstance(last, dict) and last["choices"] == [
        {"index": 0, "delta": {"content": "!"}, "finish_reason": "length"}
    ]
    assert isinstance(finish, dict) and finish["choices"][0]["delta"] == {}  # type: ignore[index]
    assert isinstance(usage, dict) and usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    assert done == "[DONE]"


def test_a_non_streamed_completion_carries_usage_only_when_known() -> None:
    transcript = chat.Transcript()
    transcript.add({"text": "x", "token_ids": [4, 5], "prompt_tokens": 3, "finish_reason": "stop"})
    body = json.loads(chat.completion("c", "m", "x", transcript))
    assert body["choices"][0] == {
        "index": 0,
        "message": {"role": "assistant", "content": "x"},
        "finish_reason": "stop",
    }
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert "usage" not in json.loads(chat.completion("c", "m", "x", chat.Transcript()))


def _request(**fields: object) -> bls.ChatRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return msgspec.convert(body, bls.ChatRequest)


def test_the_request_accepts_what_openai_clients_send() -> None:
    req = _request(logprobs=False, frequency_penalty=0, parallel_tool_calls=None)
    assert req.messages[0].text() == "hi"
    assert chat.unsupported(req) is None


def test_unsupported_fields_are_named() -> None:
    assert chat.unsupported(_request(n=3)) == (
        "n = 3 is not supported: one choice per request",
        "$.n",
    )
    parts = [{"type": "text", "text": "a"}, {"type": "input_audio", "input_audio": {}}]
    req = _request(messages=[{"role": "user", "content": "x"}, {"role": "user", "content": parts}])
    message, path = chat.unsupported(req) or ("", "")
    assert path == "$.messages[1].content[1]" and "input_audio" in message
    joined = _request(messages=[{"role": "user", "content": parts[:1] * 2}])
    assert conversation(joined.messages) == [{"role": "user", "content": "aa"}]


def test_from_chat_carries_every_sampling_field_to_the_engine() -> None:
    from bls.models.vllm import from_chat

    req = _request(
        max_tokens=5,
        max_completion_tokens=9,
        temperature=0.5,
        top_p=0.9,
        seed=4,
        stop="END",
        ignore_eos=True,
        min_tokens=2,
    )
    gen = from_chat(req)
    assert (gen.max_tokens, gen.temperature, gen.top_p, gen.seed) == (9, 0.5, 0.9, 4)
    assert (gen.stop, gen.ignore_eos, gen.min_tokens) == (["END"], True, 2)
    assert gen.messages == req.messages and gen.prompt is None
    assert from_chat(_request(), max_tokens=3).max_tokens == 3


def test_models_lists_the_names() -> None:
    body = json.loads(chat.models(["tiny"]))
    assert body["object"] == "list" and [m["id"] for m in body["data"]] == ["tiny"]
