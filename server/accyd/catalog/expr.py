"""Integer expressions over runtime scalars: extents, derived scalars and grid sizes.

A stage's ``forward i`` is ``Arg(i)`` and its ``ceil_div(i, d)`` is
``CeilDiv(Arg(i), d)``; constants and products cover 2-D extents such as
``rows * cols``. Manifests write them as text (``"ceil_div(n, 4096)"``), which
``parse`` reads with Python's own parser and a whitelist of node kinds.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from accyd.catalog.dtypes import DType, Scalar
from accyd.errors import InvalidArtifact

__all__ = ["Arg", "CeilDiv", "Const", "Expr", "Mul", "parse"]

U32_MAX = 2**32 - 1


@dataclass(frozen=True, slots=True)
class Arg:
    """The argument at ``index``, forwarded with its own type."""

    index: int

    def max_index(self) -> int:
        return self.index

    def result_dtype(self, arg_dtypes: Sequence[DType]) -> DType:
        return arg_dtypes[self.index]

    def evaluate(self, args: Sequence[Scalar]) -> Scalar:
        return args[self.index]

    def __str__(self) -> str:
        return f"arg{self.index}"


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


@dataclass(frozen=True, slots=True)
class CeilDiv:
    """``ceil(inner / divisor)`` over integers; the result is u32."""

    inner: Expr
    divisor: int

    def max_index(self) -> int:
        return self.inner.max_index()

    def result_dtype(self, arg_dtypes: Sequence[DType]) -> DType:
        _require_integer(self.inner, arg_dtypes)
        return DType.U32

    def evaluate(self, args: Sequence[Scalar]) -> Scalar:
        value = _integer(self.inner.evaluate(args), self)
        return _u32(-(-value // self.divisor), self)

    def __str__(self) -> str:
        return f"ceil_div({self.inner}, {self.divisor})"


@dataclass(frozen=True, slots=True)
class Mul:
    """The product of two integer expressions; the result is u32 when used as a scalar."""

    left: Expr
    right: Expr

    def max_index(self) -> int:
        return max(self.left.max_index(), self.right.max_index())

    def result_dtype(self, arg_dtypes: Sequence[DType]) -> DType:
        _require_integer(self.left, arg_dtypes)
        _require_integer(self.right, arg_dtypes)
        return DType.U32

    def evaluate(self, args: Sequence[Scalar]) -> Scalar:
        return _u32(self.extent(args), self)

    def extent(self, args: Sequence[Scalar]) -> int:
        return extent_of(self.left, args) * extent_of(self.right, args)

    def __str__(self) -> str:
        return f"{self.left} * {self.right}"


Expr = Arg | Const | CeilDiv | Mul


def extent_of(expr: Expr, args: Sequence[Scalar]) -> int:
    """The expression as an unbounded integer: extents may pass 2^32 (rows * cols)."""
    if isinstance(expr, Mul):
        return expr.extent(args)
    if isinstance(expr, CeilDiv):
        return -(-extent_of(expr.inner, args) // expr.divisor)
    return _integer(expr.evaluate(args), expr)


def _integer(value: Scalar, expr: Expr) -> int:
    if not value.dtype.is_integer:
        raise InvalidArtifact(f"{expr} needs an integer argument, got {value.dtype.value}")
    result = int(value.value)
    if result < 0:
        raise InvalidArtifact(f"{expr} is negative ({result})")
    return result


def _u32(value: int, expr: Expr) -> Scalar:
    if value > U32_MAX:
        raise InvalidArtifact(f"{expr} = {value} overflows u32")
    return Scalar(DType.U32, value)


def _require_integer(expr: Expr, arg_dtypes: Sequence[DType]) -> None:
    if not expr.result_dtype(arg_dtypes).is_integer:
        raise InvalidArtifact(f"{expr} needs an integer argument")


def parse(text: str, names: Mapping[str, int]) -> Expr:
    """Parse ``text`` such as ``"ceil_div(n, 64)"`` with ``names`` mapping to indices."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as error:
        raise ValueError(f"cannot parse expression {text!r}: {error.msg}") from None
    return _build(tree.body, text, names)


def _build(node: ast.expr, text: str, names: Mapping[str, int]) -> Expr:
    if isinstance(node, ast.Name):
        if node.id not in names:
            known = ", ".join(names) or "none"
            raise ValueError(f"{text!r} names {node.id!r}, which is no runtime scalar ({known})")
        return Arg(names[node.id])
    if isinstance(node, ast.Constant) and type(node.value) is int:
        if not 0 <= node.value <= U32_MAX:
            raise ValueError(f"{text!r}: constant {node.value} is outside 0..{U32_MAX}")
        return Const(node.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return Mul(_build(node.left, text, names), _build(node.right, text, names))
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "ceil_div"
        and len(node.args) == 2
        and not node.keywords
    ):
        divisor = node.args[1]
        if not (isinstance(divisor, ast.Constant) and type(divisor.value) is int):
            raise ValueError(f"{text!r}: ceil_div's divisor must be an integer constant")
        if divisor.value <= 0:
            raise ValueError(f"{text!r}: ceil_div's divisor must be positive")
        return CeilDiv(_build(node.args[0], text, names), divisor.value)
    raise ValueError(
        f"{text!r}: expressions may use scalar names, integer constants, '*' and ceil_div(x, d)"
    )
