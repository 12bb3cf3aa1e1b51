"""The OpenAI-compatible chat endpoint's shapes: what a chat script's items become.

A script declared with ``@bls.script(openai="chat")`` takes a :class:`bls.ChatRequest`
(or a subclass) and returns or yields its answer. Each item may be a string (a text
delta) or a message with ``text`` and, when the engine knows them, ``token_ids`` (the
delta's tokens), ``prompt_tokens``, ``cached_tokens``, ``finish_reason`` and ``logprobs``
— :class:`bls.models.vllm.GenerateItem` is one. From those, ``bls serve`` answers ``POST
/v1/chat/completions`` as `vllm serve` does (:mod:`.chat_answers` runs it): ``usage``
with the engine's token counts (and ``prompt_tokens_details.cached_tokens``, the prompt
tokens its prefix cache held, where the engine says), ``finish_reason``, ``logprobs``, a
choice per run of the script for ``n`` > 1, ``tool_calls`` for a forced ``tool_choice``,
and, when ``stream_options.include_usage`` is set, a last chunk carrying ``usage``.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

import msgspec

from ..chat_request import ChatRequest, ToolMode
from ..conversation import conversation
from ..errors import ErrorKind, InvalidRequest, StageError
from ..tools import call_entry

__all__ = [
    "ChatChunks",
    "PromptDetails",
    "Transcript",
    "Usage",
    "completion",
    "completion_id",
    "finish_of",
    "models",
    "tool_calls",
    "total_usage",
    "unsupported",
]

_encode = msgspec.json.encode


def unsupported(req: Any) -> tuple[str, str] | None:
    """``(message, field path)`` for what the endpoint cannot honour, else None."""
    problem = req.problem() if isinstance(req, ChatRequest) else None
    if problem is not None:
        return problem
    try:
        conversation(getattr(req, "messages", []))
    except InvalidRequest as exc:
        return exc.message, exc.path
    return None


def completion_id() -> str:
    return "chatcmpl-" + secrets.token_hex(12)


class PromptDetails(msgspec.Struct):
    cached_tokens: int


class Usage(msgspec.Struct, omit_defaults=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptDetails | None = None  # where the engine said


class Transcript:
    """What the frontend learns from one choice's items as they pass: their text, and
    the engine's token counts, finish reason and logprobs where the items carry them."""

    __slots__ = (
        "cached_tokens",
        "completion_tokens",
        "counted",
        "finish_reason",
        "logprobs",
        "parts",
        "prompt_tokens",
    )

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.cached_tokens: int | None = None  # the prompt's tokens the engine had cached
        self.completion_tokens = 0
        self.counted = False  # some item carried token ids
        self.finish_reason: str | None = None
        self.parts: list[str] = []
        self.logprobs: list[Any] | None = None  # the entries, once an item carried some

    def add(self, item: Any) -> tuple[str, str | None, Any]:
        """The item's text, if it ends the answer its finish reason, and its logprobs."""
        if isinstance(item, str):
            self.parts.append(item)
            return item, None, None
        if isinstance(item, dict):
            item = _Item(item)
        text = getattr(item, "text", None)
        if not isinstance(text, str):
            raise TypeError(
                f"a chat script must produce str or items with 'text', "
                f"got {type(item).__qualname__}"
            )
        self.parts.append(text)
        tokens = getattr(item, "token_ids", None)
        if tokens is not None:
            self.counted = True
            self.completion_tokens += len(tokens)
        prompt = getattr(item, "prompt_tokens", None)
        if prompt:
            self.prompt_tokens = prompt
        cached = getattr(item, "cached_tokens", None)
        if cached is not None:
            self.cached_tokens = cached
        finish = getattr(item, "finish_reason", None)
        if finish is not None:
            self.finish_reason = finish
        logprobs = getattr(item, "logprobs", None)
        if logprobs is not None:
            self.logprobs = (self.logprobs or []) + list(logprobs)
        return text, finish, logprobs

    def text(self) -> str:
        return "".join(self.parts)

    def usage(self) -> Usage | None:
        """Token counts, when the items carried them (plain strings do not)."""
        if not self.counted:
            return None
        cached = self.cached_tokens
        return Usage(
            self.prompt_tokens,
            self.completion_tokens,
            self.prompt_tokens + self.completion_tokens,
            None if cached is None else PromptDetails(cached),
        )


def total_usage(transcripts: list[Transcript]) -> Usage | None:
    """The usage of all choices: the prompt once, every choice's tokens (as `vllm
    serve` counts ``n`` > 1)."""
    usages = [u for u in (t.usage() for t in transcripts) if u is not None]
    if not usages:
        return None
    prompt = usages[0].prompt_tokens
    generated = sum(u.completion_tokens for u in usages)
    return Usage(prompt, generated, prompt + generated, usages[0].prompt_tokens_details)


class _Item:
    """A dict item (from an untyped remote stage) read like a message."""

    __slots__ = (
        "cached_tokens",
        "finish_reason",
        "logprobs",
        "prompt_tokens",
        "text",
        "token_ids",
    )

    def __init__(self, d: dict[str, Any]) -> None:
        self.text = d.get("text")
        self.token_ids = d.get("token_ids")
        self.prompt_tokens = d.get("prompt_tokens")
        self.cached_tokens = d.get("cached_tokens")
        self.finish_reason = d.get("finish_reason")
        self.logprobs = d.get("logprobs")


def tool_calls(
    entry: str, req: ChatRequest, mode: ToolMode, transcript: Transcript
) -> list[dict[str, Any]]:
    """The calls a forced ``tool_choice``'s output names, in OpenAI's shape (as `vllm
    serve` reads the same output): for ``"required"`` a list of ``{"name",
    "parameters"}``, for a named function its arguments. :class:`StageError`
    ``invalid_response`` when the output is not that (an output cut at ``max_tokens``,
    or a script that did not pass the request's constraint to its engine)."""
    text = transcript.text()
    try:
        if mode == "named":
            json.loads(text)
            return [_call(req.named_tool(), text)]
        calls = json.loads(text)
        if not isinstance(calls, list) or not calls:
            raise ValueError("not a list of calls")
        return [_call(c["name"], json.dumps(c["parameters"], ensure_ascii=False)) for c in calls]
    except (ValueError, KeyError, TypeError) as exc:
        if transcript.finish_reason == "length":
            hint = "the engine stopped at max_tokens: raise it, or bound the parameters"
            hint += (
                " (maxLength, additionalProperties: false)"
                if mode == "named"
                else (" or the calls (parallel_tool_calls: false)")
            )
        else:
            hint = "does the script pass the request's constraint to its engine (from_chat)?"
        why = f"the answer to tool_choice {req.tool_choice!r} is not a tool call ({exc}): {hint}"
        raise StageError(entry, ErrorKind.INVALID_RESPONSE, why) from None


def _call(name: str, arguments: str) -> dict[str, Any]:
    return call_entry("chatcmpl-tool-" + secrets.token_hex(16), name, arguments)  # (vLLM's ids)


def finish_of(transcript: Transcript, mode: ToolMode | None) -> str:
    """A choice's finish reason: ``"tool_calls"`` for a ``"required"`` choice that
    ended by itself, as `vllm serve` says."""
    finish = transcript.finish_reason or "stop"
    return "tool_calls" if mode == "required" and finish == "stop" else finish


class _Reply(msgspec.Struct, omit_defaults=True):
    role: str
    content: str | None
    tool_calls: list[dict[str, Any]] | None = None


class _Logprobs(msgspec.Struct):
    content: list[Any]


class _Choice(msgspec.Struct):
    index: int
    message: _Reply
    finish_reason: str
    logprobs: _Logprobs | None = None


class _Completion(msgspec.Struct, omit_defaults=True):
    id: str
    object: str  # (always sent: "chat.completion", as OpenAI's API and vLLM's send it)
    created: int
    model: str
    choices: list[_Choice]
    usage: Usage | None = None


def completion(
    cid: str,
    model: str,
    transcripts: list[Transcript],
    calls: list[list[dict[str, Any]] | None],
    mode: ToolMode | None,
) -> bytes:
    """A non-streamed answer: a choice per transcript, with its tool calls where the
    request forced some."""
    choices = []
    for index, (transcript, made) in enumerate(zip(transcripts, calls, strict=True)):
        if made is None:
            message = _Reply("assistant", transcript.text())
        else:
            message = _Reply("assistant", "", made)
        logprobs = None if transcript.logprobs is None else _Logprobs(transcript.logprobs)
        choices.append(_Choice(index, message, finish_of(transcript, mode), logprobs))
    usage = total_usage(transcripts)
    body = _Completion(cid, "chat.completion", int(time.time()), model, choices, usage=usage)
    return _encode(body)


class ChatChunks:
    """The SSE frames of one streamed chat answer, as OpenAI sends them. The frame of a
    text delta is constant byte strings around the encoded text: the per-token path."""

    __slots__ = ("_head", "_tails")

    def __init__(self, cid: str, model: str, n: int = 1) -> None:
        self._head = (
            b'data: {"id":"%s","object":"chat.completion.chunk","created":%d,"model":%s,'
            b'"choices":[{"index":' % (cid.encode(), int(time.time()), _encode(model))
        )
        self._tails = [b"%d," % i for i in range(n)]

    def _open(self, index: int) -> bytes:
        return self._head + self._tails[index] + b'"delta":'

    def role(self, index: int = 0) -> bytes:
        """The opening chunk: the assistant's role and empty content, as OpenAI sends."""
        return self._open(index) + b'{"role":"assistant","content":""},"finish_reason":null}]}\n\n'

    def text(
        self, text: str, finish: str | None = None, index: int = 0, logprobs: Any = None
    ) -> bytes:
        return self._frame(index, b'{"content":' + _encode(text) + b"}", finish, logprobs)

    def calls(self, made: list[dict[str, Any]], finish: str, index: int = 0) -> bytes:
        """A choice's tool calls, whole, in one delta, with its finish."""
        deltas = [{"index": i, **call} for i, call in enumerate(made)]
        return self._frame(index, b'{"tool_calls":' + _encode(deltas) + b"}", finish, None)

    def finish(self, finish: str, index: int = 0) -> bytes:
        return self._frame(index, b"{}", finish, None)

    def _frame(self, index: int, delta: bytes, finish: str | None, logprobs: Any) -> bytes:
        frame = self._open(index) + delta
        if logprobs is not None:
            frame += b',"logprobs":{"content":' + _encode(logprobs) + b"}"
        ending = b"null" if finish is None else _encode(finish)
        return frame + b',"finish_reason":' + ending + b"}]}\n\n"

    def usage(self, usage: msgspec.Struct) -> bytes:
        """The last chunk when ``stream_options.include_usage`` is set: no choices."""
        head = self._head[: self._head.index(b'"choices"')]
        return head + b'"choices":[],"usage":' + _encode(usage) + b"}\n\n"

    @staticmethod
    def done() -> bytes:
        return b"data: [DONE]\n\n"


class _Model(msgspec.Struct):
    id: str
    created: int
    owned_by: str = "bls"
    object: str = "model"


class _Models(msgspec.Struct):
    data: list[_Model]
    object: str = "list"


def models(names: list[str]) -> bytes:
    """The body of ``GET /v1/models``."""
    now = int(time.time())
    return _encode(_Models([_Model(name, now) for name in names]))
