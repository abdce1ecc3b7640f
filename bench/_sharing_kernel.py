"""The sharing benchmark's kernel (catalog/fma.cu): its size, geometry and result on the host."""

from __future__ import annotations

from typing import Any

import numpy as np

PIPELINE = "bench.fma"
COUNT = 1024
"""Elements of x and y."""
GRID, BLOCK = 8, 128
SYNC_EVERY = 16
"""Each stream (or session) is synchronized after this many of its launches."""
TOLERANCE = 1e-4


def expected(x: np.ndarray[Any, np.dtype[np.float32]], iters: int) -> np.ndarray[Any, Any]:
    """What the kernel computes: v = v * 0.999 + 0.001, ``iters`` times (fmaf within 1e-5)."""
    v = x.astype(np.float32)
    a, b = np.float32(0.999), np.float32(0.001)
    for _ in range(iters):
        v = v * a + b
    return v


def max_error(
    y: np.ndarray[Any, Any], x: np.ndarray[Any, np.dtype[np.float32]], iters: int
) -> float:
    """Largest difference of ``y`` from ``expected``; raises past TOLERANCE."""
    error = float(np.max(np.abs(y - expected(x, iters))))
    if not error <= TOLERANCE:
        raise RuntimeError(f"the fma kernel computed wrong values (max error {error})")
    return error
