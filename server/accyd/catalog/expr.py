"""Integer expressions over runtime scalars: extents, shapes, derived scalars and geometry.

A stage's ``forward i`` is ``Arg(i)`` and its ``ceil_div(i, d)`` is ``CeilDiv(Arg(i), d)``.
Manifests write them as text (``"ceil_div(n, 4096)"``, ``"min(rows, 1024)"``,
``"cols * 2 + 1"``), which ``parse`` reads with Python's own parser and a whitelist of node
kinds: scalar names, integer constants, ``+ - * /`` (``/`` divides and rounds down),
``ceil_div(x, d)``, ``min(a, b)`` and ``max(a, b)``. Divisors may be expressions; a divisor
of 0, a negative result and a result past ``VALUE_LIMIT`` are refused when evaluated, before
anything is allocated or launched. Text is bounded (``MAX_TEXT``, ``MAX_NODES``) so that no
manifest can make parsing or evaluation expensive.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from accyd.catalog.dtypes import DType, Scalar
from accyd.errors import InvalidArtifact

__all__ = [
    "Add",
    "Arg",
    "Binary",
    "CeilDiv",
    "Const",
    "Div",
    "Expr",
    "Max",
    "Min",
    "Mul",
    "Sub",
    "constant_value",
    "extent_of",
    "parse",
    "render",
    "substitute",
]

U32_MAX = 2**32 - 1
VALUE_LIMIT = 2**64 - 1
"""The largest value any step of an evaluation may reach; past it is an overflow."""
MAX_TEXT = 512
MAX_NODES = 64


@dataclass(frozen=True, slots=True)
class Arg:
    """The runtime scalar at ``index``, forwarded with its own type."""

    index: int
    name: str = field(default="", compare=False)
    """How messages name it (the manifest's scalar name); not part of its identity."""

    def max_index(self) -> int:
        return self.index

    def result_dtype(self, arg_dtypes: Sequence[DType]) -> DType:
        return arg_dtypes[self.index]

    def evaluate(self, args: Sequence[Scalar]) -> Scalar:
        return args[self.index]

    def __str__(self) -> str:
        return self.name or f"scalar {self.index}"


@dataclass(frozen=True, slots=True)
class Const:
    """A fixed non-negative integer, typed u32."""

    value: int

    def max_index(self) -> int:
        return -1

    def result_dtype(self, arg_dtypes: Sequence[DType]) -> DType:
        return DType.U32

    def evaluate(self, args: Sequence[Scalar]) -> Scalar:
        return Scalar(DType.U32, self.value)

    def __str__(self) -> str:
        return str(self.value)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


_OPS: dict[str, Callable[[int, int], int]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a // b,
    "ceil_div": _ceil_div,
    "min": min,
    "max": max,
}
_DIVIDES = frozenset({"/", "ceil_div"})
_CALLS = frozenset({"ceil_div", "min", "max"})


@dataclass(frozen=True, slots=True)
class Binary:
    """``left op right`` over integers (``op`` one of ``+ - * /``, ``ceil_div``, ``min``,
    ``max``); its value as a scalar is u32."""

    op: str
    left: Expr
    right: Expr

    def max_index(self) -> int:
        return max(self.left.max_index(), self.right.max_index())

    def result_dtype(self, arg_dtypes: Sequence[DType]) -> DType:
        for side in (self.left, self.right):
            if not side.result_dtype(arg_dtypes).is_integer:
                raise InvalidArtifact(f"{self} needs integer scalars; {side} is not one")
        return DType.U32

    def evaluate(self, args: Sequence[Scalar]) -> Scalar:
        value = extent_of(self, args)
        if value > U32_MAX:
            raise InvalidArtifact(f"{self} = {value} overflows u32")
        return Scalar(DType.U32, value)

    def value(self, args: Sequence[Scalar]) -> int:
        left = extent_of(self.left, args)
        right = extent_of(self.right, args)
        if self.op in _DIVIDES and right == 0:
            raise InvalidArtifact(f"{self} divides by 0 ({self.right} is 0)")
        result = _OPS[self.op](left, right)
        if result < 0:
            raise InvalidArtifact(f"{self} is negative ({result})")
        if result > VALUE_LIMIT:
            raise InvalidArtifact(f"{self} overflows ({result} is past 2^64 - 1)")
        return result

    def __str__(self) -> str:
        return render(self)


def render(expr: Expr, names: Sequence[str] = ()) -> str:
    """The expression as a manifest writes it, each scalar by name (from ``names`` where
    given, else the name it was parsed with): ``n``, ``ceil_div(n, 4096)``, ``rows * cols``."""
    if isinstance(expr, Arg):
        return names[expr.index] if expr.index < len(names) else str(expr)
    if isinstance(expr, Const):
        return str(expr.value)
    left, right = render(expr.left, names), render(expr.right, names)
    if expr.op in _CALLS:
        return f"{expr.op}({left}, {right})"
    return f"{_wrapped(expr.left, left)} {expr.op} {_wrapped(expr.right, right)}"


def _wrapped(expr: Expr, text: str) -> str:
    return f"({text})" if isinstance(expr, Binary) and expr.op not in _CALLS else text


Expr = Arg | Const | Binary


def Add(left: Expr, right: Expr) -> Binary:
    return Binary("+", left, right)


def Sub(left: Expr, right: Expr) -> Binary:
    return Binary("-", left, right)


def Mul(left: Expr, right: Expr) -> Binary:
    return Binary("*", left, right)


def Div(left: Expr, right: Expr) -> Binary:
    return Binary("/", left, right)


def CeilDiv(inner: Expr, divisor: Expr | int) -> Binary:
    return Binary("ceil_div", inner, Const(divisor) if isinstance(divisor, int) else divisor)


def Min(left: Expr, right: Expr) -> Binary:
    return Binary("min", left, right)


def Max(left: Expr, right: Expr) -> Binary:
    return Binary("max", left, right)


def extent_of(expr: Expr, args: Sequence[Scalar]) -> int:
    """The expression as an integer (extents may pass 2^32: ``rows * cols``)."""
    if isinstance(expr, Binary):
        return expr.value(args)
    value = expr.evaluate(args)
    if not value.dtype.is_integer:
        raise InvalidArtifact(f"{expr} needs an integer scalar, got {value.dtype.value}")
    result = int(value.value)
    if result < 0:
        raise InvalidArtifact(f"{expr} is negative ({result})")
    return result


def constant_value(expr: Expr) -> int | None:
    """The value of an expression that names no scalar (checked now), else ``None``."""
    if expr.max_index() >= 0:
        return None
    return extent_of(expr, ())


def substitute(expr: Expr, replacements: Sequence[Expr]) -> Expr:
    """``expr`` with each ``Arg(i)`` replaced by ``replacements[i]``: a kernel's geometry,
    written over its own scalars, restated over the pipeline's through a stage's scalars."""
    if isinstance(expr, Arg):
        return replacements[expr.index]
    if isinstance(expr, Binary):
        return Binary(
            expr.op, substitute(expr.left, replacements), substitute(expr.right, replacements)
        )
    return expr


def parse(text: str, names: Mapping[str, int]) -> Expr:
    """Parse ``text`` such as ``"ceil_div(n, 64)"`` with ``names`` mapping to indices."""
    if len(text) > MAX_TEXT:
        raise ValueError(f"an expression is at most {MAX_TEXT} characters; this has {len(text)}")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as error:
        raise ValueError(f"cannot parse expression {text!r}: {error.msg}") from None
    except (RecursionError, MemoryError):
        raise ValueError(f"expression {text[:40]!r}... nests too deeply") from None
    count = sum(1 for _ in ast.walk(tree))
    if count > MAX_NODES * 2:
        raise ValueError(f"expression {text[:40]!r}... has too many terms (at most {MAX_NODES})")
    return _build(tree.body, text, names)


_BINOPS: dict[type[ast.operator], str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.FloorDiv: "/",
    ast.Div: "/",
}


def _checked(expr: Binary, text: str) -> Binary:
    if expr.op in _DIVIDES and isinstance(expr.right, Const) and expr.right.value == 0:
        raise ValueError(f"{text!r} divides by 0")
    return expr


def _build(node: ast.expr, text: str, names: Mapping[str, int]) -> Expr:
    if isinstance(node, ast.Name):
        if node.id not in names:
            known = ", ".join(names) or "none"
            raise ValueError(f"{text!r} names {node.id!r}, which is no runtime scalar ({known})")
        return Arg(names[node.id], node.id)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        if not 0 <= node.value <= U32_MAX:
            raise ValueError(f"{text!r}: constant {node.value} is outside 0..{U32_MAX}")
        return Const(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        op = _BINOPS[type(node.op)]
        left, right = _build(node.left, text, names), _build(node.right, text, names)
        return _checked(Binary(op, left, right), text)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _CALLS
        and len(node.args) == 2
        and not node.keywords
    ):
        left, right = (_build(arg, text, names) for arg in node.args)
        return _checked(Binary(node.func.id, left, right), text)
    raise ValueError(
        f"{text!r}: expressions may use scalar names, integer constants, + - * / "
        "(rounding down), ceil_div(x, d), min(a, b) and max(a, b)"
    )
