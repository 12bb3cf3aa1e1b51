"""The OpenAI-compatible chat endpoint: request, response and stream-chunk shapes.

A script declared with ``@bls.script(openai="chat")`` takes a :class:`ChatRequest` (or a
subclass) and returns a string, or yields strings (text deltas); ``bls serve`` answers
``POST /v1/chat/completions`` with it in the shapes the OpenAI clients expect.
"""

from __future__ import annotations

import secrets
import time
from typing import Any, Literal

import msgspec

from .messages import Message

__all__ = ["ChatMessage", "ChatRequest", "chunk", "completion", "text_of"]


class ChatMessage(Message):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


class ChatRequest(Message):
    """The body of ``POST /v1/chat/completions`` (the fields a script usually needs)."""

    model: str
    messages: list[ChatMessage]
    stream: bool = False
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    user: str | None = None
    stream_options: dict[str, Any] | None = None


class _Delta(msgspec.Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None


class _ChunkChoice(msgspec.Struct):
    index: int
    delta: _Delta
    finish_reason: Literal["stop", "length"] | None = None


class _Chunk(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[_ChunkChoice]
    object: str = "chat.completion.chunk"


class _Reply(msgspec.Struct):
    role: str
    content: str


class _Choice(msgspec.Struct):
    index: int
    message: _Reply
    finish_reason: str = "stop"


class _Completion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[_Choice]
    object: str = "chat.completion"


def completion_id() -> str:
    return "chatcmpl-" + secrets.token_hex(12)


def text_of(item: Any) -> str:
    """The text in what a chat script produced: a string, or a message with ``text``."""
    if isinstance(item, str):
        return item
    text = getattr(item, "text", None)
    if isinstance(text, str):
        return text
    if isinstance(item, dict) and isinstance(item.get("text"), str):
        return str(item["text"])
    raise TypeError(f"a chat script must produce str, got {type(item).__qualname__}")


def completion(cid: str, model: str, text: str) -> bytes:
    body = _Completion(
        id=cid,
        created=int(time.time()),
        model=model,
        choices=[_Choice(index=0, message=_Reply(role="assistant", content=text))],
    )
    return msgspec.json.encode(body)


def chunk(
    cid: str,
    model: str,
    *,
    content: str | None = None,
    role: str | None = None,
    finish: Literal["stop", "length"] | None = None,
) -> bytes:
    body = _Chunk(
        id=cid,
        created=int(time.time()),
        model=model,
        choices=[
            _ChunkChoice(index=0, delta=_Delta(role=role, content=content), finish_reason=finish)
        ],
    )
    return msgspec.json.encode(body)
