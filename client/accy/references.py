"""Float64 numpy references of the built-in pipelines, for ``accy run --check`` and tests."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["CHUNK", "REFERENCES", "Comparison", "Reference", "compare", "find", "relative_l2"]

Array = np.ndarray[Any, Any]


CHUNK = 1 << 20
"""Elements compared at a time: checking a large result takes a few MiB, not copies of it."""

Pieces = Iterator[list[Array]]
"""Expected values in order, a piece per result each step (an empty piece: none yet)."""


@dataclass(frozen=True, slots=True)
class Reference:
    """A pipeline's meaning in float64, computed a chunk at a time, and a tolerance."""

    stream: Callable[[Sequence[Array], Mapping[str, float], int], Pieces]
    """``stream(operands, scalars, chunk)``: the expected results, piece by piece, each
    piece computed in float64 from at most ``chunk`` elements of each operand."""
    tolerance: float
    """Largest relative L2 error accepted. A float32 scan or sum built from tiles (as
    every backend's is) stays near 1e-7; a single running float32 sum over 10^6
    inputs would not (about 1.3e-5)."""

    def compute(self, operands: Sequence[Array], scalars: Mapping[str, float]) -> list[Array]:
        """The whole expected results at once (for small inputs)."""
        parts: list[list[Array]] = []
        for pieces in self.stream(operands, scalars, CHUNK):
            parts.append(pieces)
        count = len(parts[0]) if parts else 0
        return [np.concatenate([p[i] for p in parts]) for i in range(count)]


def _wide(op: Array, start: int, stop: int) -> Array:
    return np.asarray(op[start:stop], dtype=np.float64)


def _scan(ops: Sequence[Array], s: Mapping[str, float], chunk: int) -> Pieces:
    n, carry = int(s["n"]), 0.0
    for start in range(0, n, chunk):
        piece = np.cumsum(_wide(ops[0], start, min(start + chunk, n)))
        piece += carry
        carry = float(piece[-1])
        yield [piece]


def _reduce_sum(ops: Sequence[Array], s: Mapping[str, float], chunk: int) -> Pieces:
    n, total = int(s["n"]), 0.0
    for start in range(0, n, chunk):
        total += float(_wide(ops[0], start, min(start + chunk, n)).sum())
    yield [np.array([total])]


def _saxpy(ops: Sequence[Array], s: Mapping[str, float], chunk: int) -> Pieces:
    n = int(s["n"])
    a = float(np.float32(s["a"]))
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        yield [a * _wide(ops[0], start, stop) + _wide(ops[1], start, stop)]


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
    *,
    chunk: int = CHUNK,
) -> list[Comparison]:
    """Every result against the float64 reference computed from ``operands``, a chunk at a
    time: memory beyond the arrays given stays a few times ``chunk`` elements."""
    count = len(results)
    done = [0] * count
    error = [0.0] * count
    norm = [0.0] * count
    short: set[int] = set()  # results with fewer elements than their reference
    for pieces in reference.stream(operands, scalars, chunk):
        for i, want in enumerate(pieces):
            got = results[i].reshape(-1)[done[i] : done[i] + want.size]
            if got.size < want.size:
                short.add(i)
                continue
            diff = np.asarray(got, dtype=np.float64) - want
            error[i] += float(np.dot(diff, diff))
            norm[i] += float(np.dot(want, want))
            done[i] += want.size
    return [
        Comparison(i, _relative(error[i], norm[i], i in short), reference.tolerance)
        for i in range(count)
    ]


def _relative(error: float, norm: float, short: bool) -> float:
    """The relative L2 error from summed squares (the absolute one against zeros)."""
    if short:
        return math.inf
    return math.sqrt(error) / math.sqrt(norm) if norm > 0 else math.sqrt(error)
