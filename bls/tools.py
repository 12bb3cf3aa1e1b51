"""Tools an LLM may call, typed: each tool's arguments are a message type, and the LLM's
reply is decoded into either a :class:`ToolCall` (its arguments that type) or the answer.

The choice is forced through structured outputs (:mod:`bls.constraints`): the engine may
only write ``{"tool": NAME, "arguments": {...}}`` for one of the tools offered or
``{"answer": ...}``, so any model — a small or random one too — picks a tool that
exists with arguments that decode, or answers. A tool stage is an ordinary stage: the
script calls it (``await stage(call.name, call.arguments)``) and gives the result back
(:meth:`ToolCall.result`).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

import msgspec

from .constraints import bounded, decode_output
from .conversation import ChatMessage
from .errors import ErrorKind, StageError
from .messages import type_name

__all__ = [
    "Tool",
    "ToolCall",
    "call_entry",
    "choice_schema",
    "decode_reply",
    "tool_of",
    "tool_specs",
]


class Tool:
    """A tool on offer: its ``name`` (the stage that runs it, usually), the message type
    of its ``arguments`` and a ``description`` for the model's chat template."""

    __slots__ = ("arguments", "description", "name")

    def __init__(self, name: str, arguments: type, description: str = "") -> None:
        self.name = name
        self.arguments = arguments
        self.description = description

    def __repr__(self) -> str:
        return f"bls.Tool({self.name!r}, {type_name(self.arguments)})"


def tool_of(tool: Any) -> Tool:
    """A :class:`Tool`, or a typed stage handle (``bls.Stage``) offered as one: its
    name, its request type, the first paragraph of that type's docstring."""
    if isinstance(tool, Tool):
        return tool
    name, request = getattr(tool, "name", None), getattr(tool, "request", None)
    if isinstance(name, str) and isinstance(request, type):
        doc = (request.__doc__ or "").strip().split("\n\n")[0]
        return Tool(name, request, " ".join(doc.split()))
    raise TypeError(f"a tool is a bls.Tool or a typed stage handle (bls.Stage), not {tool!r}")


class ToolCall(msgspec.Struct, kw_only=True):
    """The LLM chose to call tool ``name`` with ``arguments`` (of that tool's type).

    Give the result back to the LLM with :meth:`message` and :meth:`result`::

        messages += [call.message(), call.result(await stage(call.name, call.arguments))]
    """

    name: str
    arguments: Any
    id: str = msgspec.field(default_factory=lambda: "call-" + secrets.token_hex(8))

    def message(self) -> ChatMessage:
        """The assistant's turn that made this call (OpenAI's shape)."""
        arguments = msgspec.json.encode(self.arguments).decode()
        return ChatMessage(role="assistant", tool_calls=[call_entry(self.id, self.name, arguments)])

    def result(self, value: Any) -> ChatMessage:
        """The tool's answer, as the ``tool`` turn that follows :meth:`message`."""
        content = value if isinstance(value, str) else msgspec.json.encode(value).decode()
        return ChatMessage(role="tool", tool_call_id=self.id, content=content)


def call_entry(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """One entry of an assistant message's ``tool_calls``, in OpenAI's shape
    (``arguments``: the JSON text)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_specs(tools: Sequence[Tool]) -> list[dict[str, Any]]:
    """The tools as OpenAI's function specs: what a model's chat template renders."""
    specs = []
    for tool in tools:
        function = {"name": tool.name, "parameters": _schema(tool.arguments)}
        if tool.description:
            function["description"] = tool.description
        specs.append({"type": "function", "function": function})
    return specs


def choice_schema(tools: Sequence[Tool], answer: Any) -> dict[str, Any]:
    """The JSON schema of a reply: one of ``{"tool": NAME, "arguments": ARGS}`` per tool,
    or ``{"answer": ANSWER}``; bounded (:func:`bls.constraints.bounded`)."""
    types = [tool.arguments for tool in tools] + [answer]
    refs, defs = msgspec.json.schema_components(types, ref_template="#/$defs/{name}")
    branches: list[dict[str, Any]] = [
        _object({"tool": {"const": tool.name}, "arguments": ref})
        for tool, ref in zip(tools, refs, strict=False)
    ]
    branches.append(_object({"answer": refs[-1]}))
    schema: dict[str, Any] = {"anyOf": branches}
    if defs:
        schema["$defs"] = defs
    return bounded(schema)


def decode_reply(
    stage: str,
    text: str,
    tools: Sequence[Tool],
    answer: Any,
    finish_reason: str | None,
    max_tokens: int | None,
) -> Any:
    """A reply under :func:`choice_schema` as a :class:`ToolCall` or the answer;
    :class:`StageError` ``invalid_response`` naming the field where it is neither."""
    what = f"a call of {' or '.join(t.name for t in tools)}, or the answer ({type_name(answer)})"
    reply = decode_output(stage, text, dict[str, Any], finish_reason, max_tokens, what)
    if "tool" in reply:
        by_name = {tool.name: tool for tool in tools}
        tool = by_name.get(reply["tool"])
        if tool is None:
            why = f"$.tool: {reply['tool']!r} is none of the tools offered ({', '.join(by_name)})"
            raise StageError(stage, ErrorKind.INVALID_RESPONSE, why)
        arguments = _convert(stage, reply.get("arguments"), tool.arguments, "$.arguments")
        return ToolCall(name=tool.name, arguments=arguments)
    if "answer" in reply:
        return _convert(stage, reply["answer"], answer, "$.answer")
    raise StageError(stage, ErrorKind.INVALID_RESPONSE, "the reply has neither `tool` nor `answer`")


def _convert(stage: str, value: Any, tp: Any, where: str) -> Any:
    try:
        return msgspec.convert(value, tp)
    except msgspec.ValidationError as exc:
        why = str(exc).replace("`$", f"`{where}", 1)
        if "`" not in why:
            why = f"{why} - at `{where}`"
        raise StageError(
            stage, ErrorKind.INVALID_RESPONSE, f"the reply is not a valid {type_name(tp)}: {why}"
        ) from None


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def _schema(tp: Any) -> dict[str, Any]:
    """``tp``'s schema standing alone (its definitions inlined under ``$defs``)."""
    return bounded(msgspec.json.schema(tp))
