"""``bls check``: which stage names a script uses, and whether they are bound right (the
same checks the runtime makes when it opens its bindings, and when a late replica
answers)."""

from __future__ import annotations

import ast
import types
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from .bindings import Binding
from .messages import Signature, compatible, type_name

__all__ = [
    "StageUse",
    "declare",
    "find_stage_uses",
    "names_stages_dynamically",
    "type_problems",
    "typed_handles",
    "use_problems",
]


class StageUse(msgspec.Struct, frozen=True):
    """A literal stage name found in a script's source."""

    name: str
    streaming: bool
    file: str
    line: int


_UNARY = {"stage", "Stage", "Tool"}  # (a tool is called as a unary stage of its name)
_STREAM = {"StreamStage", "ask"}  # (bls.ask streams from the LLM stage it names)


def _callee(node: ast.expr) -> tuple[str, bool] | None:
    """('stage', streaming) for stage(...)/bls.stage(...)/stage.stream(...)/Stage(...),
    and the other calls whose first argument names a stage: bls.ask(...), bls.Tool(...)."""
    if isinstance(node, ast.Name):
        if node.id in _UNARY:
            return node.id, False
        if node.id in _STREAM:
            return node.id, True
        return None
    if isinstance(node, ast.Attribute):
        if node.attr == "stream" and _callee(node.value) == ("stage", False):
            return "stage", True
        if isinstance(node.value, ast.Name) and node.value.id == "bls":
            if node.attr in _UNARY:
                return node.attr, False
            if node.attr in _STREAM:
                return node.attr, True
    return None


def _parse(path: str | Path) -> ast.Module:
    return ast.parse(Path(path).read_text(), filename=str(path))


def _stage_calls(tree: ast.Module) -> list[tuple[ast.Call, bool]]:
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            found = _callee(node.func)
            if found:
                calls.append((node, found[1]))
    return calls


def _literal(node: ast.Call) -> str | None:
    first = node.args[0]
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def _is_handle(obj: Any) -> bool:
    kind = type(obj)
    return kind.__module__ == "bls.stages" and kind.__name__ in ("Stage", "StreamStage")


def _handles(module: Any) -> dict[str, tuple[str, bool]]:
    """The module's globals that are typed stage handles: global name -> (stage, streaming).

    Handles declared in another module and imported (an interface shared by several
    scripts) are only visible this way, not in the source.
    """
    return {
        attr: (obj.name, bool(obj.streaming))
        for attr, obj in vars(module).items()
        if _is_handle(obj)
    }


def typed_handles(*modules: Any) -> list[Any]:
    """The typed stage handles the scripts in ``modules`` can see, whose types the
    runtime checks the bindings against: each module's globals (handles it imported
    included), and those of the modules it imports by name (``import contracts``)."""
    found: dict[int, Any] = {}
    for module in modules:
        if module is None:
            continue
        for obj in vars(module).values():
            if _is_handle(obj):
                found[id(obj)] = obj
            elif isinstance(obj, types.ModuleType) and obj is not module:
                for inner in vars(obj).values():
                    if _is_handle(inner):
                        found[id(inner)] = inner
    return list(found.values())


def find_stage_uses(path: str | Path, module: Any = None) -> list[StageUse]:
    """Every ``stage("x")``, ``stage.stream("x")``, ``Stage("x", ...)`` with a literal name;
    with the loaded ``module``, also every call of a typed handle it imported."""
    uses = []
    tree = _parse(path)
    for node, streaming in _stage_calls(tree):
        name = _literal(node)
        if name is not None:
            uses.append(StageUse(name, streaming, str(path), node.lineno))
    handles = _handles(module) if module is not None else {}
    if handles:
        for call in ast.walk(tree):
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Name)
                and call.func.id in handles
            ):
                name, streaming = handles[call.func.id]
                uses.append(StageUse(name, streaming, str(path), call.lineno))
    return uses


def names_stages_dynamically(path: str | Path) -> bool:
    """Whether the script calls a stage by a computed name (``stage(name, req)``), so
    the names it uses cannot all be read from its source."""
    return any(_literal(node) is None for node, _ in _stage_calls(_parse(path)))


# -- the bindings against the script ------------------------------------------------


def declare(declared: dict[str, Signature], name: str, signature: Signature) -> None:
    """Add the types a typed handle declares for ``name`` to ``declared``; TypeError if
    another handle declared other types for it."""
    previous = declared.get(name)
    if previous is not None and previous != signature:
        first, second = _sig_text(previous), _sig_text(signature)
        hint = " (different classes with the same name: is a module imported twice?)"
        raise TypeError(
            f"stage {name!r} is declared twice with different types: {first} and {second}"
            + (hint if first == second else "")
        )
    declared[name] = signature


def _sig_text(sig: Signature) -> str:
    arrow = "->>" if sig.streaming else "->"
    return f"{type_name(sig.request)} {arrow} {type_name(sig.response)}"


def type_problems(name: str, binding: Binding, decl: Signature | None) -> list[str]:
    """Why a typed handle's declared types (``decl``) and a binding's signature disagree."""
    if decl is None:
        return []
    sig = binding.signature
    problems = []
    if decl.streaming != sig.streaming:
        want = "streaming (StreamStage)" if decl.streaming else "unary (Stage)"
        have = "a streaming worker" if sig.streaming else "a unary worker"
        problems.append(
            f"stage {name!r} is declared {want} but bound to {have} ({binding.description})"
        )
    request_schema, response_schema = binding.schemas
    takes, returns = binding.type_labels
    if not compatible(sig.request, decl.request, declared_schema=request_schema):
        problems.append(
            f"stage {name!r}: the script sends {type_name(decl.request)} but the worker "
            f"({binding.description}) takes {takes}"
        )
    if not compatible(decl.response, sig.response, actual_schema=response_schema):
        problems.append(
            f"stage {name!r}: the script expects {type_name(decl.response)} but the worker "
            f"({binding.description}) returns {returns}"
        )
    return problems


def use_problems(
    uses: Iterable[StageUse],
    bindings: Mapping[str, Binding],
    declared: Mapping[str, Signature],
    unopened: Iterable[str] = (),
) -> list[str]:
    """Stage names a script's source uses that are unbound or called in the wrong mode
    (``unopened`` bindings, whose workers never answered, have no mode to compare)."""
    problems: list[str] = []
    seen: set[tuple[str, bool]] = {(name, mode) for name in unopened for mode in (True, False)}
    for use in uses:
        if (use.name, use.streaming) in seen:
            continue
        seen.add((use.name, use.streaming))
        where = f"{use.file}:{use.line}"
        binding = bindings.get(use.name)
        if binding is None:
            problems.append(
                f"stage {use.name!r} is not bound (used at {where}): add [stages.{use.name}] "
                f"to bls.toml or pass --bind {use.name}=TARGET"
            )
        elif use.name not in declared and use.streaming != binding.signature.streaming:
            # With a typed handle, type_problems() has compared the modes already.
            want = "stage.stream()" if use.streaming else "stage()"
            have = "streaming" if binding.signature.streaming else "unary"
            problems.append(
                f"stage {use.name!r} is called with {want} at {where} but is bound to a "
                f"{have} worker ({binding.description})"
            )
    return problems
