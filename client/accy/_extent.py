"""Evaluate a pipeline's extent and shape expressions ("n", "ceil_div(n, 64)", "rows * cols",
"min(n, 1024)", "n / 2") here, as the daemon does."""

from __future__ import annotations

import ast
from collections.abc import Mapping

__all__ = ["ExtentError", "evaluate", "names"]


class ExtentError(ValueError):
    """An extent expression this client cannot read, or one that names a missing scalar."""


def _parse(expression: str) -> ast.expr:
    try:
        return ast.parse(expression.strip(), mode="eval").body
    except SyntaxError as error:
        raise ExtentError(f"cannot read extent {expression!r}: {error.msg}") from None


def _eval(node: ast.expr, scalars: Mapping[str, int], expression: str) -> int:
    match node:
        case ast.Constant(value=int() as value) if not isinstance(value, bool):
            return value
        case ast.Name(id=name):
            if name not in scalars:
                raise ExtentError(f"extent {expression!r} needs the scalar {name!r}")
            return int(scalars[name])
        case ast.BinOp(left=left, op=ast.Mult() | ast.Add() | ast.Sub() as op, right=right):
            a, b = _eval(left, scalars, expression), _eval(right, scalars, expression)
            if isinstance(op, ast.Mult):
                return a * b
            return a + b if isinstance(op, ast.Add) else a - b
        case ast.BinOp(left=left, op=ast.Div() | ast.FloorDiv(), right=right):
            return _eval(left, scalars, expression) // _divisor(right, scalars, expression)
        case ast.Call(func=ast.Name(id="ceil_div"), args=[inner, divisor], keywords=[]):
            d = _divisor(divisor, scalars, expression)
            return -(-_eval(inner, scalars, expression) // d)
        case ast.Call(func=ast.Name(id="min" | "max" as name), args=[a, b], keywords=[]):
            pick = min if name == "min" else max
            return pick(_eval(a, scalars, expression), _eval(b, scalars, expression))
    raise ExtentError(f"cannot read extent {expression!r}: unsupported {ast.dump(node)}")


def _divisor(node: ast.expr, scalars: Mapping[str, int], expression: str) -> int:
    d = _eval(node, scalars, expression)
    if d <= 0:
        raise ExtentError(f"extent {expression!r} divides by {d}")
    return d


def evaluate(expression: str, scalars: Mapping[str, int]) -> int:
    """The number of elements ``expression`` asks for, given integer runtime scalars."""
    return _eval(_parse(expression), scalars, expression)


def names(expression: str) -> set[str]:
    """The scalar names an extent expression refers to (``ceil_div`` excluded)."""
    tree = _parse(expression)
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in called}
