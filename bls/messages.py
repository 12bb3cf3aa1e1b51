"""Messages and the type rules that make inline and remote stages interchangeable.

A value crossing a stage boundary is converted to the type that the receiving side
declared. Inline bindings apply the same rules the wire applies, so a script sees the
same Python types and values either way:

- a request is converted to the worker's annotated request type;
- a result is converted to the type registered for the stage by a typed handle, or
  else to the worker's annotated return type;
- with no type known, a value becomes msgspec "builtins" (dicts, lists, scalars), which
  is what a decoded wire payload is.
"""

from __future__ import annotations

import collections.abc
import difflib
import inspect
import re
import typing
from collections.abc import Callable
from typing import Any

import msgspec

__all__ = [
    "MAX_DEPTH",
    "Message",
    "Signature",
    "always_within_limits",
    "beyond_limits",
    "compatible",
    "convert",
    "field_of",
    "signature_of",
    "type_name",
]

# What any request must stay within, whatever its binding: the wire carries integers of
# 64 bits (signed or unsigned) and values nested this deep at most.
MAX_DEPTH = 100
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1


class Message(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Base class for every request, response and stream item.

    A ``msgspec.Struct``: declare fields with annotations, get validation at every
    boundary (HTTP, the wire, inline stage calls) and fast encoding. A field the type
    does not declare is an error naming it (a typo is never silently dropped); a type
    that should accept and ignore extra fields says so:
    ``class Req(bls.Message, forbid_unknown_fields=False)``.
    """


_STREAM_ORIGINS = {
    collections.abc.AsyncIterator,
    collections.abc.AsyncIterable,
    collections.abc.AsyncGenerator,
}


class Signature(msgspec.Struct, frozen=True):
    """What a worker or script takes and gives, read from its annotations."""

    request: Any
    response: Any
    streaming: bool


def signature_of(fn: Callable[..., Any], *, skip_self: bool = False) -> Signature:
    """Read the request type (first parameter) and response/item type of ``fn``.

    Missing annotations are ``Any``. For an async generator the item type comes from an
    ``AsyncIterator[T]``/``AsyncGenerator[T, None]`` return annotation. Wrappers that
    change the calling convention (``@bls.batch``) state theirs in ``__bls_signature__``.
    """
    declared = getattr(fn, "__bls_signature__", None)
    if isinstance(declared, Signature):
        return declared
    streaming = inspect.isasyncgenfunction(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = getattr(fn, "__annotations__", {}) or {}
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if skip_self and params:
        params = params[1:]
    request = hints.get(params[0].name, Any) if params else Any
    response = hints.get("return", Any)
    if streaming and typing.get_origin(response) in _STREAM_ORIGINS:
        args = typing.get_args(response)
        response = args[0] if args else Any
    elif streaming:
        response = Any
    return Signature(request=request, response=response, streaming=streaming)


def beyond_limits(value: Any) -> tuple[str, str] | None:
    """``(problem, field path)`` when ``value`` holds an integer the wire cannot carry or
    is nested deeper than :data:`MAX_DEPTH`; None when it is within the limits.

    Checked where requests come in (HTTP, ``bls run``), so that a request is refused the
    same way whether its stages are bound in process or remote."""
    if _within(value, 0):  # every request pays this; only a refused one the paths below
        return None
    stack: list[tuple[Any, str, int]] = [(value, "$", 0)]
    while stack:
        v, path, depth = stack.pop()
        t = type(v)
        if t is int:
            if not _INT_MIN <= v <= _INT_MAX:
                return "integer out of range: bls carries 64-bit integers", path
            continue
        if t in _SCALARS or v is None:
            continue
        if depth >= MAX_DEPTH:
            return f"nested deeper than {MAX_DEPTH} levels", path
        if t is list or t is tuple:
            stack.extend((x, f"{path}[{i}]", depth + 1) for i, x in enumerate(v))
        elif t is dict:
            stack.extend((x, f"{path}.{k}", depth + 1) for k, x in v.items())
        elif isinstance(v, msgspec.Struct):
            stack.extend((getattr(v, f), f"{path}.{f}", depth + 1) for f in v.__struct_fields__)
    return None


_SCALARS = frozenset({str, bytes, float, bool})


def always_within_limits(tp: Any) -> bool:
    """Whether every value msgspec decodes as ``tp`` is within :func:`beyond_limits`'s
    limits, so that a request of that type need not be checked: no integer that may be
    out of range, nothing untyped, no type that holds itself."""
    try:
        info = msgspec.inspect.type_info(tp)
    except (TypeError, ValueError):
        return False
    return _bounded(info, 0, set())


def _bounded(t: msgspec.inspect.Type, depth: int, seen: set[type]) -> bool:
    mi = msgspec.inspect
    if depth >= MAX_DEPTH:
        return False
    if isinstance(t, (mi.StrType, mi.FloatType, mi.BoolType, mi.BytesType, mi.NoneType)):
        return True
    if isinstance(t, mi.IntType):
        low = t.ge if t.ge is not None else (t.gt + 1 if t.gt is not None else None)
        high = t.le if t.le is not None else (t.lt - 1 if t.lt is not None else None)
        return low is not None and high is not None and _INT_MIN <= low and high <= _INT_MAX
    inner: list[msgspec.inspect.Type]
    if isinstance(t, (mi.ListType, mi.VarTupleType, mi.SetType, mi.FrozenSetType)):
        inner = [t.item_type]
    elif isinstance(t, mi.TupleType):
        inner = list(t.item_types)
    elif isinstance(t, mi.DictType):
        inner = [t.key_type, t.value_type]
    elif isinstance(t, mi.UnionType):
        return all(_bounded(x, depth, seen) for x in t.types)
    elif isinstance(t, mi.StructType) and t.cls not in seen:
        seen.add(t.cls)
        inner = [f.type for f in t.fields]
    else:  # Any, Raw, a struct that holds itself, the rarer types: checked each time
        return False
    return all(_bounded(x, depth + 1, seen) for x in inner)


def _within(v: Any, depth: int) -> bool:
    t = type(v)
    if t is int:
        return _INT_MIN <= v <= _INT_MAX
    if t in _SCALARS or v is None:
        return True
    if depth >= MAX_DEPTH:
        return False
    if t is list or t is tuple:
        items: Any = v
    elif t is dict:
        items = v.values()
    elif isinstance(v, msgspec.Struct):
        items = msgspec.structs.astuple(v)
    else:
        return True
    depth += 1
    for x in items:
        if not _within(x, depth):
            return False
    return True


def type_name(tp: Any) -> str:
    """A readable name for a type, for error messages."""
    if tp is Any:
        return "Any"
    if isinstance(tp, type):
        return f"{tp.__module__}.{tp.__qualname__}" if tp.__module__ != "builtins" else tp.__name__
    return repr(tp)


def _to_builtins(value: Any) -> Any:
    try:
        return msgspec.to_builtins(value, builtin_types=(bytes, bytearray, memoryview))
    except TypeError:
        # Arrays and tensors: left as they are, as the wire hands them over.
        return value


def field_of(value: Any, name: str) -> Any:
    """``value``'s field ``name``, None when it has none: an attribute of a typed value,
    a key of a dict (what the README's untyped style hands over where typed code gets
    a struct), read alike."""
    if isinstance(value, dict):
        return value.get(name)
    return getattr(value, name, None)


def convert(value: Any, tp: Any) -> Any:
    """Convert ``value`` to ``tp`` the way a decoded wire payload would be.

    Raises ``msgspec.ValidationError`` (with the field path) when it cannot.
    """
    if tp is Any:
        return _to_builtins(value)
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    return msgspec.convert(value, tp, from_attributes=True, builtin_types=(bytes, bytearray))


def fast_type(tp: Any) -> type | None:
    """The class to ``isinstance``-check against to skip conversion, if there is one."""
    if tp is Any or not isinstance(tp, type):
        return None
    return tp


def _normalise(schema: Any, defs: dict[str, Any], depth: int = 0) -> Any:
    """A JSON schema with refs inlined and names dropped: two types with the same shape
    but different class names normalise to the same value."""
    if depth > 32:
        return "<recursive>"
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str):
            return _normalise(defs.get(ref.rsplit("/", 1)[-1], {}), defs, depth + 1)
        return {
            k: _normalise(v, defs, depth + 1)
            for k, v in schema.items()
            if k not in ("title", "description", "$defs", "examples")
        }
    if isinstance(schema, list):
        return [_normalise(v, defs, depth + 1) for v in schema]
    return schema


def json_schema(tp: Any) -> dict[str, Any]:
    """The JSON schema of a type (``{}`` for ``Any``)."""
    if tp is Any:
        return {}
    try:
        return msgspec.json.schema(tp)
    except (TypeError, ValueError):
        return {}


def shape(schema: dict[str, Any]) -> Any:
    """Normalised shape of a JSON schema, for comparing types across processes."""
    return _normalise(schema, schema.get("$defs", {}))


def compatible(
    declared: Any,
    actual: Any,
    *,
    declared_schema: dict[str, Any] | None = None,
    actual_schema: dict[str, Any] | None = None,
) -> bool:
    """Whether a value of type ``actual`` is acceptable where ``declared`` is expected.

    ``Any`` on either side, the same class, a subclass, or the same shape (same fields
    and field types under other class names) are all compatible. A type known only by
    its JSON schema (a remote worker's) is compared by shape.
    """
    if declared is Any and declared_schema:
        return shape_compatible(declared_schema, json_schema(actual))
    if actual is Any and actual_schema:
        return shape_compatible(json_schema(declared), actual_schema)
    if declared is Any or actual is Any or declared == actual:
        return True
    if isinstance(declared, type) and isinstance(actual, type) and issubclass(actual, declared):
        return True
    return shape_compatible(json_schema(declared), json_schema(actual))


def shape_compatible(declared: dict[str, Any], actual: dict[str, Any]) -> bool:
    """Schema-level :func:`compatible`, for types known only by their JSON schema."""
    if not declared or not actual:
        return True
    return bool(shape(declared) == shape(actual))


# -- what a validation error leaves out ---------------------------------------------------

_FIELD_ERROR = re.compile(r"^Object (missing required|contains unknown) field `(?P<name>[^`]*)`")
_STEP = re.compile(r"\.(?P<key>[A-Za-z_][\w]*)|\[(?P<index>\d+)\]")


def field_hint(tp: Any, data: bytes | str, message: str, path: str) -> str:
    """What msgspec's error about one field leaves out: the other half of a misspelling.

    For "missing required field `messages`" the body's fields at ``path`` that ``tp`` does
    not have (``message``, say); for "contains unknown field `message`", the required fields
    missing beside it. "" when there is nothing to add (or the body cannot be read)."""
    match = _FIELD_ERROR.match(message)
    if match is None:
        return ""
    try:
        raw = msgspec.json.decode(data)
        for step in _STEP.finditer(path[1:]):
            key, index = step.group("key"), step.group("index")
            raw = raw[int(index)] if index is not None else raw[key]
        struct = _struct_at(msgspec.inspect.type_info(tp), path)
    except (msgspec.DecodeError, KeyError, IndexError, TypeError, ValueError):
        return ""
    if struct is None or not isinstance(raw, dict):
        return ""
    names = {f.encode_name for f in struct.fields}
    unknown = [k for k in raw if k not in names]
    missing = [f.encode_name for f in struct.fields if f.required and f.encode_name not in raw]
    if match.group(1) == "missing required":
        wanted = match.group("name")
        close = difflib.get_close_matches(wanted, unknown, n=1)
        if close:
            return f"; the body has `{close[0]}`, which is not a field: did you mean `{wanted}`?"
        return f"; the body has {_listed(unknown)}, which are not fields" if unknown else ""
    given = match.group("name")
    close = difflib.get_close_matches(given, missing, n=1)
    if close:
        return f"; required field `{close[0]}` is missing: did you mean `{close[0]}`?"
    return f"; required field(s) {_listed(missing)} missing too" if missing else ""


_UNKNOWN = re.compile(
    r"Object contains unknown field `(?P<name>[^`]*)`(?: - at `(?P<path>[^`]*)`)?"
)


def unknown_field_hint(tp: Any, error: str, hidden: tuple[str, ...] = ()) -> str:
    """For msgspec's "Object contains unknown field `x`" (at a path of ``tp``): " (did
    you mean `y`?)" with the closest field there (``hidden`` fields aside), else ""."""
    match = _UNKNOWN.search(error)
    if match is None:
        return ""
    try:
        struct = _struct_at(msgspec.inspect.type_info(tp), match.group("path") or "$")
    except (TypeError, ValueError):
        return ""
    if struct is None:
        return ""
    names = [f.encode_name for f in struct.fields if f.encode_name not in hidden]
    close = difflib.get_close_matches(match.group("name"), names, n=1, cutoff=0.6)
    return f" (did you mean `{close[0]}`?)" if close else ""


def _listed(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def _struct_at(info: Any, path: str) -> Any:
    """The struct type at ``path`` (``$.a[0].b``) inside a msgspec type description."""
    for step in _STEP.finditer(path[1:]):
        if step.group("key") is not None:
            struct = _struct_in(info)
            fields = struct.fields if struct is not None else ()
            field = next((f for f in fields if f.encode_name == step.group("key")), None)
            if field is None:
                return None
            info = field.type
        else:
            members = info.types if isinstance(info, msgspec.inspect.UnionType) else (info,)
            lists = (msgspec.inspect.ListType, msgspec.inspect.VarTupleType)
            info = next((t.item_type for t in members if isinstance(t, lists)), None)
            if info is None:
                return None
    return _struct_in(info)


def _struct_in(info: Any) -> Any:
    """A struct type, or the one struct type among a union's members."""
    if isinstance(info, msgspec.inspect.StructType):
        return info
    if isinstance(info, msgspec.inspect.UnionType):
        structs = [t for t in info.types if isinstance(t, msgspec.inspect.StructType)]
        return structs[0] if len(structs) == 1 else None
    return None
