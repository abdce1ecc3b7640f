"""Host (numpy) version of fma.cu for the host backend: ``iters`` steps of v = v*0.999 + 0.001."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

COUNT = 1024


def fma(
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    buffers: Sequence[npt.NDArray[np.uint8]],
    scalars: Sequence[float],
) -> None:
    """y[i] = x[i] after ``iters`` dependent multiply-adds, for the 1024 elements."""
    iters = int(scalars[0])
    y, x = buffers[0][: COUNT * 4].view(np.float32), buffers[1][: COUNT * 4].view(np.float32)
    v = x.astype(np.float32)
    a, b = np.float32(0.999), np.float32(0.001)
    for _ in range(iters):
        v = v * a + b
    y[:] = v
