"""The OpenAI-compatible chat endpoint: response and stream-chunk shapes.

A script declared with ``@bls.script(openai="chat")`` takes a
:class:`bls.conversation.ChatRequest` (or a subclass) and returns or yields its answer.
Each item may be a string (a text delta) or a message with ``text`` and, when the engine
knows them, ``token_ids`` (the delta's tokens), ``prompt_tokens`` and ``finish_reason``
— :class:`bls.models.vllm.GenerateItem` is one. From those, ``bls serve`` answers
``POST /v1/chat/completions`` as OpenAI does: ``usage`` with the engine's token counts,
``finish_reason`` ``"length"`` or ``"stop"``, and, when ``stream_options.include_usage``
is set, a last chunk carrying ``usage``.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import msgspec

from ..conversation import conversation
from ..errors import InvalidRequest

__all__ = ["Transcript", "completion", "completion_id", "models", "unsupported"]


def unsupported(req: Any) -> tuple[str, str] | None:
    """``(message, field path)`` for what the endpoint cannot honour, else None."""
    if getattr(req, "n", 1) != 1:
        return f"n = {req.n} is not supported: one choice per request", "$.n"
    try:
        conversation(getattr(req, "messages", []))
    except InvalidRequest as exc:
        return exc.message, exc.path
    return None


def completion_id() -> str:
    return "chatcmpl-" + secrets.token_hex(12)


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Transcript:
    """What the frontend learns from a chat script's items as they pass: the text of
    each, and the engine's token counts and finish reason where the items carry them."""

    __slots__ = ("completion_tokens", "counted", "finish_reason", "prompt_tokens")

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.counted = False  # some item carried token ids
        self.finish_reason: str | None = None

    def add(self, item: Any) -> tuple[str, str | None]:
        """The item's text and, if it ends the answer, its finish reason."""
        if isinstance(item, str):
            return item, None
        if isinstance(item, dict):
            item = _Item(item)
        text = getattr(item, "text", None)
        if not isinstance(text, str):
            raise TypeError(
                f"a chat script must produce str or items with 'text', "
                f"got {type(item).__qualname__}"
            )
        tokens = getattr(item, "token_ids", None)
        if tokens is not None:
            self.counted = True
            self.completion_tokens += len(tokens)
        prompt = getattr(item, "prompt_tokens", None)
        if prompt:
            self.prompt_tokens = prompt
        finish = getattr(item, "finish_reason", None)
        if finish is not None:
            self.finish_reason = finish
        return text, finish

    def usage(self) -> Usage | None:
        """Token counts, when the items carried them (plain strings do not)."""
        if not self.counted:
            return None
        return Usage(
            self.prompt_tokens,
            self.completion_tokens,
            self.prompt_tokens + self.completion_tokens,
        )


class _Item:
    """A dict item (from an untyped remote stage) read like a message."""

    __slots__ = ("finish_reason", "prompt_tokens", "text", "token_ids")

    def __init__(self, d: dict[str, Any]) -> None:
        self.text = d.get("text")
        self.token_ids = d.get("token_ids")
        self.prompt_tokens = d.get("prompt_tokens")
        self.finish_reason = d.get("finish_reason")


class _Reply(msgspec.Struct):
    role: str
    content: str


class _Choice(msgspec.Struct):
    index: int
    message: _Reply
    finish_reason: str


class _Completion(msgspec.Struct, omit_defaults=True):
    id: str
    created: int
    model: str
    choices: list[_Choice]
    object: str = "chat.completion"
    usage: Usage | None = None


def completion(cid: str, model: str, text: str, transcript: Transcript) -> bytes:
    """A non-streamed answer."""
    choice = _Choice(0, _Reply("assistant", text), transcript.finish_reason or "stop")
    body = _Completion(cid, int(time.time()), model, [choice], usage=transcript.usage())
    return msgspec.json.encode(body)


class _Model(msgspec.Struct):
    id: str
    created: int
    owned_by: str = "bls"
    object: str = "model"


class _Models(msgspec.Struct):
    data: list[_Model]
    object: str = "list"


_encode = msgspec.json.encode


def models(names: list[str]) -> bytes:
    """The body of ``GET /v1/models``."""
    now = int(time.time())
    return _encode(_Models([_Model(name, now) for name in names]))
