"""``bls.ask``: a typed value from an LLM stage in one line.

    verdict = await bls.ask("generator", f"Is this polite? {text}", Verdict)

It derives the constraint from the type (:mod:`bls.constraints`), sends it with the
prompt in the stage's request (``bls.models.vllm.GenerateRequest``: the vLLM worker hands
it to the engine's structured outputs), collects the streamed text and decodes it into
the type. With ``tools=`` the reply is a :class:`bls.ToolCall` or the answer
(:mod:`bls.tools`). The call is an ordinary ``stage.stream`` call: cancellation,
deadlines, priorities, hedging and fakes apply as to any other.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import msgspec

from .constraints import Constraint, constraint_for, decode_output
from .conversation import ChatMessage
from .messages import field_of
from .stages import stage
from .tools import Tool, choice_schema, decode_reply, tool_of, tool_specs

__all__ = ["MAX_TOKENS", "ask"]

MAX_TOKENS = 512  # what a reply may take, unless the call says otherwise


async def ask(
    llm: Any,
    prompt: str | Sequence[ChatMessage | dict[str, Any]],
    returns: Any = str,
    *,
    tools: Sequence[Any] = (),
    max_tokens: int = MAX_TOKENS,
    **sampling: Any,
) -> Any:
    """Ask the LLM stage ``llm`` (its name, or a ``bls.StreamStage`` handle) for a value
    of type ``returns``.

    ``prompt`` is the user's message, or the whole conversation (``bls.ChatMessage`` s or
    ``{"role", "content"}`` dicts). ``returns`` is any type msgspec decodes (a
    ``bls.Message``, ``list[...]``, ``int``...), a ``Literal``/``Enum`` of strings (a
    choice), :class:`bls.Regex`, :class:`bls.Grammar`, or ``str`` (free text).
    ``tools``: ``bls.Tool`` s or typed stage handles the LLM may call instead of
    answering; the result is then a :class:`bls.ToolCall` or a ``returns``.
    ``sampling``: any other field of the stage's request (``temperature``, ``seed``...).

    Raises :class:`bls.StageError` of kind ``invalid_response``, naming the stage and the
    field, when the output is not a ``returns`` (cut at ``max_tokens``, or an engine that
    does not decode under structured outputs).
    """
    name = llm if isinstance(llm, str) else llm.name
    offered = tuple(tool_of(t) for t in tools)
    # (stream: False, the whole answer as one item: only the end is read)
    request = {"messages": _messages(prompt), "max_tokens": max_tokens, "stream": False}
    request.update(sampling)
    constraint, specs = _asked(
        tuple((t.name, t.arguments, t.description) for t in offered), returns
    )
    if constraint is not None:
        request["constraint"] = constraint
    if specs:
        request["tools"] = specs
    text, finish = await _generate(name, request)
    if offered:
        return decode_reply(name, text, offered, returns, finish, max_tokens)
    return decode_output(name, text, returns, finish, max_tokens)


@functools.lru_cache(maxsize=512, typed=True)  # (Regex("x") != Grammar("x"))
def _asked(
    tools: tuple[tuple[str, type, str], ...], returns: Any
) -> tuple[Constraint | None, list[dict[str, Any]]]:
    """The constraint and the tools' specs for a call, made once per kind of call (a
    schema takes about 0.1 ms to derive): shared, and never changed by those who read
    them."""
    offered = [Tool(*tool) for tool in tools]
    if offered:
        return Constraint(json=choice_schema(offered, returns)), tool_specs(offered)
    return constraint_for(returns), []


def _messages(prompt: Any) -> list[Any]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [msgspec.to_builtins(m) if isinstance(m, ChatMessage) else m for m in prompt]


async def _generate(name: str, request: dict[str, Any]) -> tuple[str, str | None]:
    """The stage's whole text and its finish reason (items typed or dicts alike)."""
    parts: list[str] = []
    finish = None
    async for item in stage.stream(name, request):
        parts.append(field_of(item, "text") or "")
        finish = field_of(item, "finish_reason") or finish
    return "".join(parts), finish
