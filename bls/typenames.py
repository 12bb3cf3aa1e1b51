"""Naming a type so that another process, or a later run, can find it again.

A worker's hello names the classes it takes and returns (``module:QualName``), and a
caller that has loaded that module decodes into them; a record names the type each stage
call's result was converted to (:class:`TypeRef`, generics included), and a replay hands
the script its results in that type again. A name only ever finds a class in a module
that is already loaded, or one the caller allows to be imported (:func:`resolve`'s
``importable``): bytes from elsewhere never make a process run a module of their choice.
"""

from __future__ import annotations

import importlib
import sys
import types
import typing
from collections.abc import Callable
from typing import Any

import msgspec

__all__ = ["TypeRef", "class_path", "loaded_class", "malformed", "ref_of", "resolve"]

# Generic forms a TypeRef spells by name, and back.
_ORIGINS: dict[Any, str] = {
    list: "list",
    dict: "dict",
    tuple: "tuple",
    set: "set",
    frozenset: "frozenset",
}
_BUILD: dict[str, Callable[[tuple[Any, ...]], Any]] = {
    "list": lambda a: list[a[0]],  # type: ignore[valid-type]
    "dict": lambda a: dict[a[0], a[1]],  # type: ignore[valid-type]
    "tuple": lambda a: tuple[a],  # type: ignore[valid-type]
    "tuple...": lambda a: tuple[a[0], ...],  # type: ignore[valid-type]
    "set": lambda a: set[a[0]],  # type: ignore[valid-type]
    "frozenset": lambda a: frozenset[a[0]],  # type: ignore[valid-type]
    "union": lambda a: typing.Union[a],  # noqa: UP007
}

_ARITY = {"list": 1, "dict": 2, "tuple...": 1, "set": 1, "frozenset": 1}


class TypeRef(msgspec.Struct, array_like=True, frozen=True):
    """A type by name: a class (``name`` is ``module:QualName``) or a generic form
    (``list``, ``dict``, ``tuple``, ``tuple...``, ``set``, ``frozenset``, ``union``) of
    ``args``."""

    name: str
    args: tuple[TypeRef, ...] = ()


def class_path(tp: Any) -> str:
    """``module:QualName`` for a named class (lets a caller that has it use it); "" for
    anything else (a builtin, a class made inside a function)."""
    if isinstance(tp, type) and tp.__module__ != "builtins" and "<locals>" not in tp.__qualname__:
        return f"{tp.__module__}:{tp.__qualname__}"
    return ""


def loaded_class(path: str) -> Any:
    """The class ``module:QualName`` names, if its module is loaded; else ``Any``."""
    module_name, _, qual = path.partition(":")
    module = sys.modules.get(module_name)
    if not qual or module is None:
        return Any
    found = _attribute(module, qual)
    return found if isinstance(found, type) else Any


_refs: dict[Any, TypeRef | None] = {}


def ref_of(tp: Any) -> TypeRef | None:
    """``tp`` by name; None for ``Any`` and for what cannot be named (the value then
    stays as the wire's builtins, as it does for ``Any``)."""
    try:
        return _refs[tp]
    except KeyError:
        ref = _refs[tp] = _ref(tp)
        return ref
    except TypeError:  # not hashable: not cached
        return _ref(tp)


def _ref(tp: Any) -> TypeRef | None:
    if tp is Any or tp is None:
        return None
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _ref(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return _generic("union", typing.get_args(tp))
    if origin is not None:
        name = _ORIGINS.get(origin)
        args = typing.get_args(tp)
        if name is None:
            return None
        if name == "tuple" and len(args) == 2 and args[1] is Ellipsis:
            name, args = "tuple...", args[:1]
        return _generic(name, args)
    if isinstance(tp, type):
        if tp.__module__ == "builtins":
            return TypeRef(f"builtins:{tp.__qualname__}")
        path = class_path(tp)
        return TypeRef(path) if path else None
    return None


def malformed(ref: TypeRef, depth: int = 0) -> str | None:
    """Why ``ref`` cannot be one :func:`ref_of` made (a generic form with the wrong
    number of arguments, a name that is no ``module:QualName``), or None."""
    if depth > 32:
        return "nested too deep"
    if ref.name in _BUILD:
        arity = _ARITY.get(ref.name)
        if not ref.args or (arity is not None and len(ref.args) != arity):
            return f"{ref.name} with {len(ref.args)} argument(s)"
        return next((p for a in ref.args if (p := malformed(a, depth + 1))), None)
    module, _, qual = ref.name.partition(":")
    names = [*module.split("."), *qual.split(".")]
    if ref.args or not module or not qual or not all(n.isidentifier() for n in names):
        return f"{ref.name!r} names no class"
    return None


def _generic(name: str, args: tuple[Any, ...]) -> TypeRef | None:
    """A generic form of ``args``; None when one of them cannot be named."""
    refs = []
    for arg in args:
        ref = TypeRef("builtins:NoneType") if arg is type(None) else _ref(arg)
        if ref is None:
            return None
        refs.append(ref)
    return TypeRef(name, tuple(refs))


def resolve(ref: TypeRef | None, importable: Callable[[str], bool] = lambda _: False) -> Any:
    """The type ``ref`` names (``Any`` for None). A class is looked up in its module when
    that is loaded, or imported first when ``importable(module)`` allows it; LookupError
    naming it when it cannot be found."""
    if ref is None:
        return Any
    problem = malformed(ref)
    if problem is not None:
        raise LookupError(problem)
    build = _BUILD.get(ref.name)
    if build is not None:
        return build(tuple(resolve(a, importable) for a in ref.args))
    module_name, _, qual = ref.name.partition(":")
    if module_name == "builtins" and qual == "NoneType":
        return type(None)
    module = sys.modules.get(module_name)
    if module is None and qual and importable(module_name):
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            raise LookupError(f"{ref.name}: its module does not import: {exc}") from None
    found = _attribute(module, qual) if module is not None and qual else None
    if not isinstance(found, type):
        where = "is not loaded here" if module is None else f"has no class {qual}"
        raise LookupError(f"{ref.name}: module {module_name} {where}")
    return found


def _attribute(module: Any, qual: str) -> Any:
    obj = module
    for part in qual.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj
