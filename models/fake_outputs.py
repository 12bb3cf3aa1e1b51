"""Text that satisfies a constraint, for :class:`bls.models.fakellm.FakeLLM`: a value of a
JSON schema, a string a regular expression matches, one of a choice — chosen by a seeded
random generator, so the same request gets the same text.

It covers what :func:`bls.constraints.constraint_for` and the chat endpoint produce
(objects, arrays, strings with their bounds and patterns, numbers within theirs,
``enum``/``const``, ``anyOf``/``oneOf``, local ``$ref`` s) and Python's regular
expression syntax; a grammar it cannot follow, and says so.
"""

from __future__ import annotations

import json
import random
import string
from typing import Any

import bls

__all__ = ["satisfying"]

_LETTERS = string.ascii_lowercase
_PRINTABLE = string.ascii_letters + string.digits + " .,-_"
_MAX_DEPTH = 32


def satisfying(constraint: bls.Constraint, rng: random.Random) -> str:
    """A text that ``constraint`` admits."""
    if constraint.choice is not None:
        return rng.choice(constraint.choice)
    if constraint.regex is not None:
        return regex_sample(constraint.regex, rng)
    if constraint.json is not None:
        value = _value(constraint.json, constraint.json, rng, 0)
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if constraint.json_object:
        return "{}"
    raise bls.InvalidRequest(
        "", "FakeLLM cannot follow a grammar: give it `replies`", "$.constraint.grammar"
    )


def _value(schema: Any, root: dict[str, Any], rng: random.Random, depth: int) -> Any:
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return None
    if "$ref" in schema:
        return _value(_resolve(schema["$ref"], root), root, rng, depth + 1)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return _value(rng.choice(schema[key]), root, rng, depth + 1)
    if "allOf" in schema:
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            merged.update(part)
        return _value(merged, root, rng, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = rng.choice(kind)
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    return _BY_TYPE[kind](schema, root, rng, depth)


def _resolve(ref: str, root: dict[str, Any]) -> Any:
    node: Any = root
    for part in ref.removeprefix("#/").split("/"):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _object(schema: dict[str, Any], root: dict[str, Any], rng: random.Random, depth: int) -> Any:
    properties = schema.get("properties", {})
    required = set(schema.get("required", ()))
    out = {}
    for name, sub in properties.items():
        if name in required or rng.random() < 0.5:
            out[name] = _value(sub, root, rng, depth + 1)
    extra = schema.get("additionalProperties")
    if not properties and isinstance(extra, dict):
        for i in range(rng.randint(0, min(2, schema.get("maxProperties", 2)))):
            out[f"k{i}"] = _value(extra, root, rng, depth + 1)
    return out


def _array(schema: dict[str, Any], root: dict[str, Any], rng: random.Random, depth: int) -> Any:
    low = schema.get("minItems", 0)
    high = max(low, min(schema.get("maxItems", 3), low + 3))
    items = schema.get("items", {})
    return [_value(items, root, rng, depth + 1) for _ in range(rng.randint(low, high))]


def _string(schema: dict[str, Any], root: dict[str, Any], rng: random.Random, depth: int) -> Any:
    if "pattern" in schema:
        return regex_sample(schema["pattern"], rng)
    special = _FORMATS.get(schema.get("format", ""))
    if special is not None:
        return special
    low = schema.get("minLength", 0)
    high = max(low, min(schema.get("maxLength", 12), low + 12))
    return "".join(rng.choice(_LETTERS) for _ in range(rng.randint(low, high)))


_FORMATS = {
    "date-time": "2026-01-01T00:00:00Z",
    "date": "2026-01-01",
    "time": "00:00:00Z",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "email": "someone@example.com",
    "uri": "https://example.com/",
}


def _integer(schema: dict[str, Any], root: dict[str, Any], rng: random.Random, depth: int) -> Any:
    low, high = _range(schema, 1)
    return rng.randint(int(low), int(high))


def _number(schema: dict[str, Any], root: dict[str, Any], rng: random.Random, depth: int) -> Any:
    low, high = _range(schema, 0)
    value = low + (high - low) * rng.uniform(0.01, 0.99)  # (inside exclusive bounds too)
    rounded = round(value, 3)
    return rounded if low < rounded < high else value


def _range(schema: dict[str, Any], step: int) -> tuple[float, float]:
    """Where to pick a number: within the schema's bounds, near 0 where they allow."""
    low = schema.get("minimum", schema.get("exclusiveMinimum", -(10**18)) + step)
    high = schema.get("maximum", schema.get("exclusiveMaximum", 10**18) - step)
    center = min(max(0, low), high)
    return max(low, center - 50), min(high, center + 50)


_BY_TYPE = {
    "object": _object,
    "array": _array,
    "string": _string,
    "integer": _integer,
    "number": _number,
    "boolean": lambda schema, root, rng, depth: rng.random() < 0.5,
    "null": lambda schema, root, rng, depth: None,
}


def regex_sample(pattern: str, rng: random.Random) -> str:
    """A string ``pattern`` matches whole (so also one a JSON schema's ``pattern``,
    which may match anywhere, admits)."""
    from re import _parser  # type: ignore[attr-defined]

    return "".join(_emit(_parser.parse(pattern), rng, {}))


def _emit(parsed: Any, rng: random.Random, groups: dict[int, str]) -> list[str]:
    from re import _constants as c  # type: ignore[attr-defined]

    out: list[str] = []
    for op, arg in parsed:
        if op is c.LITERAL:
            out.append(chr(arg))
        elif op is c.NOT_LITERAL:
            out.append(rng.choice([ch for ch in _PRINTABLE if ord(ch) != arg]))
        elif op is c.ANY:
            out.append(rng.choice(_PRINTABLE))
        elif op is c.IN:
            out.append(_from_set(arg, rng))
        elif op is c.BRANCH:
            out.extend(_emit(rng.choice(arg[1]), rng, groups))
        elif op is c.SUBPATTERN:
            group, _, _, sub = arg
            text = "".join(_emit(sub, rng, groups))
            if group is not None:
                groups[group] = text
            out.append(text)
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", None)):
            low, high, sub = arg
            count = rng.randint(low, max(low, min(high, low + 3)))
            for _ in range(count):
                out.extend(_emit(sub, rng, groups))
        elif op is c.GROUPREF:
            out.append(groups.get(arg, ""))
        elif op is c.CATEGORY:
            out.append(_from_category(arg, rng))
        elif op is c.AT or op in (c.ASSERT, c.ASSERT_NOT):
            continue  # (anchors and lookarounds: satisfied by what is around them, mostly)
        else:
            raise bls.InvalidRequest("", f"FakeLLM cannot write a match for {op}", "$.constraint")
    return out


def _from_set(items: Any, rng: random.Random) -> str:
    from re import _constants as c  # type: ignore[attr-defined]

    negate = bool(items) and items[0][0] is c.NEGATE
    pool: list[str] = []
    for op, arg in items[1:] if negate else items:
        if op is c.LITERAL:
            pool.append(chr(arg))
        elif op is c.RANGE:
            pool.extend(chr(code) for code in range(arg[0], min(arg[1], arg[0] + 200) + 1))
        elif op is c.CATEGORY:
            pool.extend(_category(arg))
    if negate:
        pool = [ch for ch in _PRINTABLE if ch not in pool]
    return rng.choice(pool or ["x"])


_CATEGORIES = {
    "DIGIT": string.digits,
    "WORD": string.ascii_letters + string.digits + "_",
    "SPACE": " ",
}


def _category(category: Any) -> str:
    """The characters of ``\\d``, ``\\w``, ``\\s`` (ASCII ones) or their negations."""
    name = str(category).split("_")  # e.g. CATEGORY_NOT_DIGIT
    pool = _CATEGORIES.get(name[-1], "x")
    if len(name) > 2 and name[-2] == "NOT":
        pool = "".join(ch for ch in _PRINTABLE if ch not in pool)
    return pool or "x"


def _from_category(category: Any, rng: random.Random) -> str:
    return rng.choice(_category(category))
