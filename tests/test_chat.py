"""The chat endpoint's shapes: what a chat script's items become on the wire."""

from __future__ import annotations

import json

import msgspec
import pytest

import bls
from bls.conversation import conversation
from bls.serve import chat
from bls.serve.chat import ChatChunks


def frames(data: bytes) -> list[dict[str, object] | str]:
    out: list[dict[str, object] | str] = []
    for event in data.decode().split("\n\n"):
        if event:
            payload = event.removeprefix("data: ")
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def test_the_transcript_counts_the_engines_tokens_and_keeps_the_finish_reason() -> None:
    transcript = chat.Transcript()
    assert transcript.add({"text": "a", "token_ids": [1], "prompt_tokens": 7}) == ("a", None, None)
    assert transcript.add({"text": "", "token_ids": [2]}) == ("", None, None)
    assert transcript.add({"text": "b", "token_ids": [3], "finish_reason": "length"}) == (
        "b",
        "length",
        None,
    )
    assert transcript.usage() == chat.Usage(prompt_tokens=7, completion_tokens=3, total_tokens=10)
    assert transcript.finish_reason == "length"


def test_cached_tokens_reach_usage_from_a_typed_or_an_untyped_item_alike() -> None:
    from bls.models.vllm import GenerateItem

    typed = GenerateItem(text="a", token_ids=[1], prompt_tokens=9, cached_tokens=8)
    untyped = {"text": "a", "token_ids": [1], "prompt_tokens": 9, "cached_tokens": 8}
    usages = []
    for item in (typed, untyped):
        transcript = chat.Transcript()
        transcript.add(item)
        usages.append(msgspec.json.decode(msgspec.json.encode(chat.total_usage([transcript]))))
    assert (
        usages[0]
        == usages[1]
        == {
            "prompt_tokens": 9,
            "completion_tokens": 1,
            "total_tokens": 10,
            "prompt_tokens_details": {"cached_tokens": 8},
        }
    )
    # Where the engine does not say, the field is left out, as before.
    unsaid = chat.Transcript()
    unsaid.add({"text": "a", "token_ids": [1], "prompt_tokens": 9})
    assert "prompt_tokens_details" not in msgspec.json.decode(msgspec.json.encode(unsaid.usage()))


def test_plain_strings_have_no_usage_to_report() -> None:
    transcript = chat.Transcript()
    assert transcript.add("hello") == ("hello", None, None)
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
    body = json.loads(chat.completion("c", "m", [transcript], [None], None))
    assert body["choices"][0] == {
        "index": 0,
        "message": {"role": "assistant", "content": "x"},
        "finish_reason": "stop",
        "logprobs": None,
    }
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    plain = chat.Transcript()
    plain.add("x")
    assert "usage" not in json.loads(chat.completion("c", "m", [plain], [None], None))


def test_several_choices_count_the_prompt_once() -> None:
    first, second = chat.Transcript(), chat.Transcript()
    first.add({"text": "a", "token_ids": [1, 2], "prompt_tokens": 5, "finish_reason": "stop"})
    second.add({"text": "b", "token_ids": [3], "prompt_tokens": 5, "finish_reason": "length"})
    body = json.loads(chat.completion("c", "m", [first, second], [None, None], None))
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in body["choices"]] == [
        (0, "a", "stop"),
        (1, "b", "length"),
    ]
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


def test_a_required_tool_choice_answers_with_tool_calls_as_vllm_serve_does() -> None:
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    req = _request(tools=tools, tool_choice="required")
    transcript = chat.Transcript()
    transcript.add({"text": '[{"name":"calc","parameters":{"x":1}}]', "finish_reason": "stop"})
    made = chat.tool_calls("chat", req, "required", transcript)
    assert [c["function"] for c in made] == [{"name": "calc", "arguments": '{"x": 1}'}]
    assert made[0]["id"].startswith("chatcmpl-tool-") and made[0]["type"] == "function"
    body = json.loads(chat.completion("c", "m", [transcript], [made], "required"))
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {"role": "assistant", "content": "", "tool_calls": made}
    cut = chat.Transcript()
    cut.add({"text": '[{"name":"ca', "finish_reason": "length"})
    with pytest.raises(bls.StageError, match="stopped at max_tokens") as failed:
        chat.tool_calls("chat", req, "required", cut)
    assert failed.value.kind == "invalid_response" and failed.value.stage == "chat"


def test_a_named_tool_choice_answers_with_its_arguments() -> None:
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    req = _request(tools=tools, tool_choice={"type": "function", "function": {"name": "calc"}})
    assert req.constraint() == bls.Constraint(json={"type": "object"})
    transcript = chat.Transcript()
    transcript.add({"text": '{"x":2}', "finish_reason": "stop"})
    (made,) = chat.tool_calls("chat", req, "named", transcript)
    assert made["function"] == {"name": "calc", "arguments": '{"x":2}'}
    assert chat.finish_of(transcript, "named") == "stop"


def _request(**fields: object) -> bls.ChatRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return msgspec.convert(body, bls.ChatRequest)


def test_the_request_accepts_what_openai_clients_send() -> None:
    req = _request(logprobs=False, frequency_penalty=0, parallel_tool_calls=None)
    assert req.messages[0].text() == "hi"
    assert chat.unsupported(req) is None
    assert chat.unsupported(_request(n=3)) is None


def test_unsupported_fields_are_named() -> None:
    assert chat.unsupported(_request(n=0)) == ("n must be between 1 and 16", "$.n")
    tools = [{"type": "function", "function": {"name": "calc"}}]
    auto, path = chat.unsupported(_request(tools=tools)) or ("", "")
    assert path == "$.tool_choice" and '"auto" needs a tool parser' in auto
    named = _request(tools=tools, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert chat.unsupported(named) == (
        "tool_choice names 'nope', which is not among the tools (calc)",
        "$.tool_choice",
    )
    assert chat.unsupported(_request(top_logprobs=2)) == (
        "when using top_logprobs, logprobs must be set to true",
        "$.top_logprobs",
    )
    wrong = _request(response_format={"type": "xml"})
    assert (chat.unsupported(wrong) or ("", ""))[1] == "$.response_format.type"
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
    more = from_chat(
        _request(
            top_k=5,
            min_p=0.1,
            presence_penalty=0.5,
            frequency_penalty=0.25,
            repetition_penalty=1.1,
            stop_token_ids=[7],
            logprobs=True,
            top_logprobs=3,
        )
    )
    assert (more.top_k, more.min_p, more.presence_penalty, more.frequency_penalty) == (
        5,
        0.1,
        0.5,
        0.25,
    )
    assert (more.repetition_penalty, more.stop_token_ids, more.logprobs) == (1.1, [7], 3)
    assert from_chat(_request(logprobs=True)).logprobs == 0
    assert from_chat(_request()).logprobs is None and from_chat(_request()).constraint is None


def test_response_format_and_structured_outputs_become_the_constraint() -> None:
    from bls.models.vllm import from_chat

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    as_schema = {"type": "json_schema", "json_schema": {"name": "v", "schema": schema}}
    assert from_chat(_request(response_format=as_schema)).constraint == bls.Constraint(json=schema)
    as_object = from_chat(_request(response_format={"type": "json_object"}))
    assert as_object.constraint == bls.Constraint(json_object=True)
    assert from_chat(_request(response_format={"type": "text"})).constraint is None
    vllm_extra = from_chat(_request(structured_outputs={"choice": ["a", "b"]}))
    assert vllm_extra.constraint == bls.Constraint(choice=["a", "b"])
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    required = from_chat(_request(tools=tools, tool_choice="required", parallel_tool_calls=False))
    assert required.tools == tools and required.constraint is not None
    calls = required.constraint.json or {}
    assert (calls["type"], calls["minItems"], calls["maxItems"]) == ("array", 1, 1)
    assert calls["items"]["anyOf"][0]["properties"]["name"] == {"type": "string", "enum": ["f"]}
    assert from_chat(_request(tools=tools, tool_choice="none")).tools is None


def test_fields_bls_does_not_implement_are_refused_and_unknown_ones_named() -> None:
    from bls.chat_request import extra_fields

    body = {"model": "m", "messages": [], "logit_bias": {}, "echo": False, "store": True}
    assert extra_fields(msgspec.json.encode({**body, "vendor_x": 1, "another": None})) == [
        "vendor_x",
        "another",
    ]
    with pytest.raises(bls.InvalidRequest, match="logit_bias is not supported") as refused:
        extra_fields(msgspec.json.encode({**body, "logit_bias": {"5": 10}}))
    assert refused.value.path == "$.logit_bias"
    with pytest.raises(bls.InvalidRequest) as refused:
        extra_fields(msgspec.json.encode({**body, "use_beam_search": True}))
    assert refused.value.path == "$.use_beam_search"


def test_stream_chunks_carry_their_choice_index_logprobs_and_tool_calls() -> None:
    chunks = ChatChunks("c", "m", n=2)
    entry = {"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}
    text, calls = frames(
        chunks.text("a", None, 1, [entry])
        + chunks.calls([{"id": "t", "type": "function", "function": {}}], "tool_calls", 0)
    )
    assert isinstance(text, dict) and text["choices"] == [
        {
            "index": 1,
            "delta": {"content": "a"},
            "logprobs": {"content": [entry]},
            "finish_reason": None,
        }
    ]
    assert isinstance(calls, dict) and calls["choices"] == [
        {
            "index": 0,
            "delta": {"tool_calls": [{"index": 0, "id": "t", "type": "function", "function": {}}]},
            "finish_reason": "tool_calls",
        }
    ]


def test_models_lists_the_names() -> None:
    body = json.loads(chat.models(["tiny"]))
    assert body["object"] == "list" and [m["id"] for m in body["data"]] == ["tiny"]
