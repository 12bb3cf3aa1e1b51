"""`bls bench --turns`' conversations (bls.loadchat): what each turn sends, where it
goes, and what is read back from a chat completion or its stream."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bls.console import UsageError
from bls.loadchat import Conversations, follow_up

FIRST = {
    "model": "m",
    "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}],
}


def sent(request: bytes) -> tuple[str, dict[str, Any]]:
    url, _, body = request.partition(b" ")
    return url.decode(), json.loads(body)


def talks(turns: int, stream: bool = False) -> Conversations:
    urls = [lambda b, u=u: u.encode() + b" " + b for u in ("a", "b")]  # type: ignore[misc]
    return Conversations(dict(FIRST), turns, urls, stream)


def completion(text: str, prompt: int, cached: int | None) -> bytes:
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": 1}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return json.dumps({"choices": [{"message": {"content": text}}], "usage": usage}).encode()


def test_each_turn_sends_the_conversation_so_far_to_the_next_url() -> None:
    conversations = talks(turns=3)
    where, request = conversations.next(0)
    url, body = sent(request)
    assert (where, url) == (0, "a")
    assert body["messages"][1] == {"role": "user", "content": "[conversation 1] Q"}
    assert conversations.answered(0, True, completion("A1", 10, 0)) == (0, 10, 0)
    where, request = conversations.next(0)
    assert where == 1 and sent(request)[0] == "b"
    assert sent(request)[1]["messages"][1:] == [
        {"role": "user", "content": "[conversation 1] Q"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": follow_up(0)},
    ]
    assert conversations.answered(0, True, completion("A2", 20, 16)) == (1, 20, 16)
    assert len(sent(conversations.next(0)[1])[1]["messages"]) == 6
    assert conversations.answered(0, True, completion("A3", 30, None)) == (2, 30, None)
    assert conversations.finished == 1
    # The next conversation is a new one, begun where the slot begins.
    where, request = conversations.next(0)
    assert where == 0 and sent(request)[1]["messages"][1]["content"] == "[conversation 2] Q"
    assert FIRST["messages"][1]["content"] == "Q"  # (the input is not changed)


def test_a_failed_or_unreadable_turn_ends_its_conversation() -> None:
    conversations = talks(turns=3)
    conversations.next(1)
    conversations.answered(1, True, completion("A", 1, 0))
    conversations.next(1)
    assert conversations.answered(1, False, b"") == (1, None, None)
    assert sent(conversations.next(1)[1])[1]["messages"][1]["content"].startswith(
        "[conversation 2]"
    )
    assert conversations.answered(1, True, b"<html>not json</html>") == (0, None, None)
    assert conversations.started == 2 and conversations.finished == 0


def test_a_streamed_answer_is_read_from_its_chunks_and_asks_for_its_usage() -> None:
    conversations = talks(turns=2, stream=True)
    _, request = conversations.next(0)
    assert sent(request)[1]["stream_options"] == {"include_usage": True}
    chunks = [
        {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"delta": {"content": "Hel"}}]},
        {"choices": [{"delta": {"content": "lo"}, "finish_reason": "stop"}]},
        {
            "choices": [],
            "usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 8}},
        },
    ]
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    assert conversations.answered(0, True, body + b"data: [DONE]\n\n") == (0, 9, 8)
    assert sent(conversations.next(0)[1])[1]["messages"][2] == {
        "role": "assistant",
        "content": "Hello",
    }


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"messages": [{"role": "system", "content": "S"}]}, "end with the user's"),
        ({"prompt": "x"}, "end with the user's"),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "as a string"),
    ],
)
def test_an_input_that_is_not_a_conversation_is_named(body: dict[str, Any], named: str) -> None:
    with pytest.raises(UsageError, match=named):
        Conversations(body, 2, [lambda b: b], stream=False)
