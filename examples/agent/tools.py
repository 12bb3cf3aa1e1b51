"""The agent's tools: plain async functions, bound as ordinary stages (inline, or behind
`bls worker examples/agent/tools.py:calculate`)."""

import ast
import operator

from agent import Calc, Fact, Lookup, Number

_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
_MAX_POWER = 64  # (a power is the one operator that can make a huge number from a short text)


async def calculate(req: Calc) -> Number:
    """Arithmetic on numbers (+ - * / ** and parentheses); anything else is an error the
    model reads, not an exception."""
    try:
        return Number(value=float(_evaluate(ast.parse(req.expression, mode="eval").body)))
    except SyntaxError:
        return Number(error="not an expression")
    except (ValueError, ZeroDivisionError, OverflowError) as exc:
        return Number(error=str(exc)[:60])


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_POWER:
            raise ValueError(f"an exponent above {_MAX_POWER}")
        return _OPERATORS[type(node.op)](left, right)  # type: ignore[no-any-return]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))  # type: ignore[no-any-return]
    raise ValueError(f"{type(node).__name__} is not arithmetic")


FACTS = {
    "moons of mars": "2",
    "moons of jupiter": "95",
    "boiling point of water": "100 C at sea level",
    "speed of light": "299792458 m/s",
    "population of iceland": "about 390000",
    "height of everest": "8849 m",
}


async def lookup(req: Lookup) -> Fact:
    """A fact from the small table above, by its key (case and spaces do not matter)."""
    found = FACTS.get(" ".join(req.key.lower().split()))
    return Fact(error="no such fact") if found is None else Fact(value=found)
