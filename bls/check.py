"""``bls check``: which stage names a script uses, and whether they are bound right."""

from __future__ import annotations

import ast
import types
from pathlib import Path
from typing import Any

import msgspec

__all__ = ["StageUse", "find_stage_uses", "names_stages_dynamically", "typed_handles"]


class StageUse(msgspec.Struct, frozen=True):
    """A literal stage name found in a script's source."""

    name: str
    streaming: bool
    file: str
    line: int


_UNARY = {"stage", "Stage"}
_STREAM = {"StreamStage"}


def _callee(node: ast.expr) -> tuple[str, bool] | None:
    """('stage', streaming) for stage(...)/bls.stage(...)/stage.stream(...)/Stage(...)."""
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
