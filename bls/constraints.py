"""What an LLM's output must be: a constraint derived from a Python type, and the
decoding of the output back into that type.

A :class:`Constraint` travels in the LLM stage's request (``GenerateRequest.constraint``)
and the vLLM worker hands it to the engine's structured outputs, which decode under it
token by token; the same fields as vLLM's ``StructuredOutputsParams``, one of them set:

- ``json``: a JSON schema (from a type: :func:`constraint_for`);
- ``choice``: one of some strings (a ``Literal`` of strings or an ``Enum`` of them);
- ``regex``: a regular expression (:class:`Regex`);
- ``grammar``: a grammar in the engine's syntax, passed through (:class:`Grammar`);
- ``json_object``: any JSON object (the chat endpoint's ``response_format``).

A schema derived from a type is made to end: a model, even one with random weights, can
only stop early or write a valid value, never run on. Where the type does not bound it,
a string gets ``maxLength`` :data:`MAX_LENGTH`, a list or a mapping
:data:`MAX_ITEMS` entries, an integer the range JSON carries exactly (±2**53 - 1) and
a float ±:data:`MAX_NUMBER`; a struct takes no field it does not declare. Bound a field
yourself with ``Annotated[str, msgspec.Meta(max_length=...)]`` (or ``ge``/``le``,
``max_length`` on a list).
"""

from __future__ import annotations

import enum
import re
import typing
from typing import Any

import msgspec

from .errors import ErrorKind, StageError
from .messages import Message, type_name

__all__ = [
    "MAX_ITEMS",
    "MAX_LENGTH",
    "MAX_NUMBER",
    "Constraint",
    "Grammar",
    "Regex",
    "bounded",
    "constraint_for",
    "decode_output",
]

MAX_LENGTH = 256  # characters in a string the type does not bound
MAX_ITEMS = 16  # entries in a list or mapping the type does not bound
MAX_INTEGER = 2**53 - 1  # what every JSON reader keeps exact
MAX_NUMBER = 1e15


class Constraint(Message, omit_defaults=True):
    """What the engine must decode under: exactly one field set (see the module)."""

    json: dict[str, Any] | None = None
    choice: list[str] | None = None
    regex: str | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def __post_init__(self) -> None:
        given = [name for name in self.__struct_fields__ if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                f"a constraint sets exactly one of json, choice, regex, grammar, json_object "
                f"(got {', '.join(given) or 'none'})"
            )

    def kind(self) -> str:
        return next(name for name in self.__struct_fields__ if getattr(self, name) is not None)


class Regex(str):
    """``bls.ask(..., bls.Regex(r"[A-Z]{3}-\\d{4}"))``: text matching the expression
    (the whole of it); the result is a ``str``."""

    __slots__ = ()


class Grammar(str):
    """``bls.ask(..., bls.Grammar('root ::= "yes" | "no"'))``: text the grammar
    derives, in the engine's syntax (vLLM: GBNF or Lark); the result is a ``str``."""

    __slots__ = ()


def constraint_for(tp: Any) -> Constraint | None:
    """The constraint for a result of type ``tp`` (None for ``str``: free text).

    A :class:`Regex` or :class:`Grammar` value is that constraint; a ``Literal`` of
    strings or an ``Enum`` of string values, a choice; any other type msgspec can
    decode, its JSON schema, :func:`bounded`."""
    if isinstance(tp, Regex):
        return Constraint(regex=str(tp))
    if isinstance(tp, Grammar):
        return Constraint(grammar=str(tp))
    if tp is str:
        return None
    choices = _choices(tp)
    if choices is not None:
        return Constraint(choice=choices)
    return Constraint(json=schema_of(tp))


def schema_of(tp: Any) -> dict[str, Any]:
    """``tp``'s JSON schema, bounded; TypeError naming the type msgspec cannot describe."""
    try:
        schema = msgspec.json.schema(tp)
    except TypeError as exc:
        raise TypeError(f"no JSON schema for {type_name(tp)}: {exc}") from None
    return bounded(schema)


def _choices(tp: Any) -> list[str] | None:
    values: list[Any]
    if typing.get_origin(tp) is typing.Literal:
        values = list(typing.get_args(tp))
    elif isinstance(tp, type) and issubclass(tp, enum.Enum):
        values = [member.value for member in tp]
    else:
        return None
    return values if all(isinstance(v, str) for v in values) else None


def bounded(schema: Any) -> Any:
    """A copy of a JSON schema in which every string, list, mapping and number has a
    bound (the module's defaults where it had none) and every object with declared
    properties takes no others."""
    if isinstance(schema, list):
        return [bounded(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: bounded(value) for key, value in schema.items()}
    if "enum" in out or "const" in out:
        return out
    kind = out.get("type")
    if kind == "string" and "pattern" not in out and "format" not in out:
        out.setdefault("maxLength", MAX_LENGTH)
    elif kind == "array":
        out.setdefault("maxItems", MAX_ITEMS)
    elif kind == "object":
        if "properties" in out:
            out.setdefault("additionalProperties", False)
        else:
            out.setdefault("maxProperties", MAX_ITEMS)
    elif kind in ("integer", "number"):
        top = MAX_INTEGER if kind == "integer" else MAX_NUMBER
        if "minimum" not in out and "exclusiveMinimum" not in out:
            out["minimum"] = -top
        if "maximum" not in out and "exclusiveMaximum" not in out:
            out["maximum"] = top
    return out


def decode_output(
    stage: str,
    text: str,
    tp: Any,
    finish_reason: str | None,
    max_tokens: int | None,
    what: str | None = None,
) -> Any:
    """The LLM's ``text`` as a ``tp``; :class:`StageError` ``invalid_response`` naming
    the stage, the type (or ``what`` was asked for) and the field where it is not one
    (saying so when the engine cut the output at ``max_tokens``)."""
    if isinstance(tp, Regex) and re.fullmatch(tp, text) is None:
        raise _invalid(stage, tp, f"{text!r} does not match {str(tp)!r}", finish_reason, max_tokens)
    if tp is str or isinstance(tp, str):
        return text
    choices = _choices(tp)
    if choices is not None:
        if text not in choices:
            why = f"{text!r} is none of {choices}"
            raise _invalid(stage, tp, why, finish_reason, max_tokens)
        return tp(text) if isinstance(tp, type) else text
    try:
        return msgspec.json.decode(text, type=tp)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise _invalid(stage, tp, str(exc), finish_reason, max_tokens, what) from None


def _invalid(
    stage: str,
    tp: Any,
    why: str,
    finish_reason: str | None,
    max_tokens: int | None,
    what: str | None = None,
) -> StageError:
    if finish_reason == "length":
        why = (
            f"the engine stopped at max_tokens={max_tokens} before the output was complete "
            f"({why}): raise max_tokens or bound the type's strings and lists"
        )
    else:
        why = f"{why} (does the engine decode under structured outputs?)"
    if what is None:
        what = f"text matching {str(tp)!r}" if isinstance(tp, Regex) else f"a {type_name(tp)}"
    return StageError(stage, ErrorKind.INVALID_RESPONSE, f"the output is not {what}: {why}")
