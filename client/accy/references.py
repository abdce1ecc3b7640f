"""Float64 numpy references of the built-in pipelines, for ``accy run --check`` and tests."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["REFERENCES", "Comparison", "Reference", "compare", "find", "relative_l2"]

Array = np.ndarray[Any, Any]


@dataclass(frozen=True, slots=True)
class Reference:
    """A pipeline's meaning in float64: results from operands and scalars, and a tolerance."""

    compute: Callable[[Sequence[Array], Mapping[str, float]], list[Array]]
    tolerance: float
    """Largest relative L2 error accepted. A float32 scan or sum built from tiles (as
    every backend's is) stays near 1e-7; a single running float32 sum over 10^6
    inputs would not (about 1.3e-5)."""


def _scan(ops: Sequence[Array], s: Mapping[str, float]) -> list[Array]:
    return [np.cumsum(ops[0][: int(s["n"])])]


def _reduce_sum(ops: Sequence[Array], s: Mapping[str, float]) -> list[Array]:
    return [np.array([ops[0][: int(s["n"])].sum()])]


def _saxpy(ops: Sequence[Array], s: Mapping[str, float]) -> list[Array]:
    n = int(s["n"])
    a = float(np.float32(s["a"]))
    return [a * ops[0][:n] + ops[1][:n]]


REFERENCES: dict[str, Reference] = {
    "accy.kernel.device_scan": Reference(_scan, 1e-5),
    "accy.kernel.reduce_sum": Reference(_reduce_sum, 1e-5),
    "accy.kernel.saxpy": Reference(_saxpy, 1e-6),
}


def find(target: str) -> Reference | None:
    """The reference of a pipeline target, or ``None`` when none is known."""
    return REFERENCES.get(target)


def relative_l2(actual: Array, expected: Array) -> float:
    """``‖actual - expected‖₂ / ‖expected‖₂`` in float64 (the absolute error if expected is 0)."""
    a = np.asarray(actual, dtype=np.float64).reshape(-1)
    e = np.asarray(expected, dtype=np.float64).reshape(-1)
    if a.shape != e.shape:
        return math.inf
    norm = float(np.linalg.norm(e))
    error = float(np.linalg.norm(a - e))
    return error / norm if norm > 0 else error


@dataclass(frozen=True, slots=True)
class Comparison:
    """One result checked against its reference."""

    index: int
    error: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.error <= self.tolerance


def compare(
    reference: Reference,
    operands: Sequence[Array],
    results: Sequence[Array],
    scalars: Mapping[str, float],
) -> list[Comparison]:
    """Every result against the float64 reference computed from ``operands``."""
    wide = [np.asarray(op, dtype=np.float64) for op in operands]
    expected = reference.compute(wide, scalars)
    return [
        Comparison(i, relative_l2(got[: want.size], want), reference.tolerance)
        for i, (got, want) in enumerate(zip(results, expected, strict=True))
    ]
