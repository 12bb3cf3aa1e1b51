"""The OpenAI chat request: its messages and fields, as ``POST /v1/chat/completions``
takes them and as a worker (``bls.models.vllm``) turns them into a prompt.

Here, in the core, so that the frontend (``bls.serve``) and the workers both use them
and neither has to import the other.
"""

from __future__ import annotations

from typing import Any

from .errors import InvalidRequest
from .messages import Message

__all__ = ["ChatMessage", "ChatRequest", "conversation"]


class ChatMessage(Message, forbid_unknown_fields=False):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None

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


class ChatRequest(Message, forbid_unknown_fields=False):
    """The body of ``POST /v1/chat/completions``: the fields a script usually needs.
    Other fields OpenAI clients send are accepted and ignored."""

    model: str
    messages: list[ChatMessage]
    stream: bool = False
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = None
    n: int = 1
    user: str | None = None
    stream_options: dict[str, Any] | None = None


def conversation(messages: list[ChatMessage]) -> list[dict[str, str]]:
    """The messages as ``{"role", "content"}`` dicts of text, as chat templates take
    them; :class:`InvalidRequest` naming the part that is not text."""
    out = []
    for i, message in enumerate(messages):
        try:
            out.append({"role": message.role, "content": message.text()})
        except ValueError as exc:
            where, _, why = str(exc).partition(": ")
            raise InvalidRequest("", why, f"$.messages[{i}].{where}") from None
    return out
