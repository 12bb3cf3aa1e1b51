"""``bls check``: which stage names a script uses, and whether they are bound right."""

from __future__ import annotations

import ast
from pathlib import Path

import msgspec

__all__ = ["StageUse", "find_stage_uses"]


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


def find_stage_uses(path: str | Path) -> list[StageUse]:
    """Every ``stage("x")``, ``stage.stream("x")``, ``Stage("x", ...)`` with a literal name."""
    source = Path(path).read_text()
    tree = ast.parse(source, filename=str(path))
    uses = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        found = _callee(node.func)
        first = node.args[0]
        if found and isinstance(first, ast.Constant) and isinstance(first.value, str):
            uses.append(StageUse(first.value, found[1], str(path), node.lineno))
    return uses
