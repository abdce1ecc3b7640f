"""Host (numpy) kernels for the element-type, shape and expression tests."""

import ml_dtypes
import numpy as np


def axpy_f16(grid, block, buffers, scalars):
    n, a = scalars
    x, y, out = (b.view(np.float16) for b in buffers)
    out[:n] = (np.float32(a) * x[:n].astype(np.float32) + y[:n]).astype(np.float16)


def scale_bf16(grid, block, buffers, scalars):
    x, out = (b.view(ml_dtypes.bfloat16) for b in buffers)
    s, n = scalars
    out[:n] = (x[:n].astype(np.float32) * np.float32(s) + x[:n]).astype(ml_dtypes.bfloat16)


def copy(grid, block, buffers, scalars):
    (nbytes,) = scalars
    buffers[1][:nbytes] = buffers[0][:nbytes]


def transpose(grid, block, buffers, scalars):
    rows = grid[0]
    (cols,) = scalars
    x, y = (b.view(np.float32) for b in buffers)
    y[: rows * cols] = x[: rows * cols].reshape(rows, cols).T.reshape(-1)


def pairsum(grid, block, buffers, scalars):
    (half,) = scalars
    x, y = (b.view(np.float32) for b in buffers)
    y[:half] = x[: 2 * half : 2] + x[1 : 2 * half : 2]
