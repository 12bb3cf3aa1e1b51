"""The OpenAI chat messages, as ``POST /v1/chat/completions`` takes them
(:mod:`bls.chat_request`) and as a worker (``bls.models.vllm``) turns them into a prompt.

Here, in the core, so that the frontend (``bls.serve``) and the workers both use them
and neither has to import the other.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import InvalidRequest
from .messages import Message

__all__ = ["ChatMessage", "conversation"]


class ChatMessage(Message, forbid_unknown_fields=False, omit_defaults=True):
    """One turn: ``role`` and ``content``; an assistant's turn may carry the
    ``tool_calls`` it made (OpenAI's shape), and a ``tool`` turn the ``tool_call_id`` it
    answers (:class:`bls.ToolCall` makes both)."""

    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """The message's text: the string, or its text parts joined.

        Raises ``ValueError`` naming the part for a part that is not text (images and
        audio are for scripts that read ``content`` themselves)."""
        content = self.content
        if content is None or isinstance(content, str):
            return content or ""
        texts = []
        for i, part in enumerate(content):
            kind = part.get("type")
            if kind != "text" or not isinstance(part.get("text"), str):
                raise ValueError(f"content[{i}]: unsupported content part type {kind!r}")
            texts.append(part["text"])
        return "".join(texts)


def conversation(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The messages as ``{"role", "content"}`` dicts of text, as chat templates take
    them; :class:`InvalidRequest` naming the part that is not text.

    An assistant's tool calls go with it as ``tool_calls`` (their arguments parsed, as
    templates that render tools expect them) and, when it has no text, as its text too
    (``{"tool": ..., "arguments": ...}``, the reply :mod:`bls.tools` asks for), so that a
    template that knows nothing of tools still shows the model what it called; a tool's
    answer keeps its ``tool_call_id``."""
    out = []
    for i, message in enumerate(messages):
        try:
            turn: dict[str, Any] = {"role": message.role, "content": message.text()}
        except ValueError as exc:
            where, _, why = str(exc).partition(": ")
            raise InvalidRequest("", why, f"$.messages[{i}].{where}") from None
        if message.tool_calls:
            calls = [_parsed(call, i) for call in message.tool_calls]
            turn["tool_calls"] = calls
            if not turn["content"]:
                turn["content"] = _as_text(calls)
        if message.tool_call_id is not None:
            turn["tool_call_id"] = message.tool_call_id
        out.append(turn)
    return out


def _as_text(calls: list[dict[str, Any]]) -> str:
    said = [{"tool": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in calls]
    return json.dumps(said[0] if len(said) == 1 else said)


def _parsed(call: Any, i: int) -> dict[str, Any]:
    """One tool call with its arguments as a value (OpenAI sends them as JSON text)."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise InvalidRequest("", "a tool call needs function.name", f"$.messages[{i}].tool_calls")
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            why = "the arguments of a tool call are not JSON"
            raise InvalidRequest("", why, f"$.messages[{i}].tool_calls") from None
    return {**call, "function": {**function, "arguments": arguments}}
