"""Host (numpy) kernels of the built-in pipelines, with the same contracts as the CUDA kernels.

Each kernel is a function over the whole grid: ``(grid, block, buffers,
scalars)``, where ``buffers`` are uint8 views of the bound buffers, in the
stage's order, and ``scalars`` are plain numbers. Sums accumulate in float64
and store float32, so results match the CUDA kernels within float32 rounding.
Work goes in chunks of whole tiles to bound temporary memory.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

TILE = 4096
"""The tile kernels' tile (tile_sum, tile_scan, and the reduction's partials)."""
PASS_TILE = 8192
"""The single pass's tile, as its CUDA kernel's: its order of additions."""
CHUNK_TILES = 256

Bytes = npt.NDArray[np.uint8]
Dim3 = tuple[int, int, int]


def _f32(buffer: Bytes, count: int) -> npt.NDArray[np.float32]:
    return buffer[: count * 4].view(np.float32)


def _tiles(n: int, tiles: int, tile: int = TILE) -> int:
    if tiles * tile < n or (tiles - 1) * tile >= n:
        raise ValueError(f"grid of {tiles} tiles does not cover n = {n} in tiles of {tile}")
    return tiles


F32 = npt.NDArray[np.float32]


def _sums_into(sums: F32, x: F32, n: int, tiles: int, tile: int = TILE) -> None:
    for first in range(0, tiles, CHUNK_TILES):
        last = min(tiles, first + CHUNK_TILES)
        chunk = x[first * tile : min(n, last * tile)]
        padded = np.zeros((last - first) * tile, dtype=np.float64)
        padded[: chunk.size] = chunk
        sums[first:last] = padded.reshape(-1, tile).sum(axis=1)


def _offsets_into(offsets: F32, sums: F32) -> None:
    inclusive = np.cumsum(sums, dtype=np.float64)
    offsets[0] = 0.0
    offsets[1:] = inclusive[:-1]


def _scan_into(y: F32, x: F32, offsets: F32, n: int, tiles: int, tile: int = TILE) -> None:
    for first in range(0, tiles, CHUNK_TILES):
        last = min(tiles, first + CHUNK_TILES)
        start, stop = first * tile, min(n, last * tile)
        padded = np.zeros((last - first) * tile, dtype=np.float64)
        padded[: stop - start] = x[start:stop]
        scanned = np.cumsum(padded.reshape(-1, tile), axis=1)
        scanned += offsets[first:last, None]
        y[start:stop] = scanned.reshape(-1)[: stop - start]


def tile_sum(grid: Dim3, block: Dim3, buffers: Sequence[Bytes], scalars: Sequence[float]) -> None:
    """sums[b] = sum(x[b*TILE : min(n, (b+1)*TILE)])."""
    n = int(scalars[0])
    tiles = _tiles(n, grid[0])
    _sums_into(_f32(buffers[0], tiles), _f32(buffers[1], n), n, tiles)


def tile_offsets(
    grid: Dim3, block: Dim3, buffers: Sequence[Bytes], scalars: Sequence[float]
) -> None:
    """offsets = exclusive prefix sum of sums[:m]."""
    m = int(scalars[0])
    _offsets_into(_f32(buffers[0], m), _f32(buffers[1], m))


def tile_scan(grid: Dim3, block: Dim3, buffers: Sequence[Bytes], scalars: Sequence[float]) -> None:
    """y[i] = offsets[i // TILE] + inclusive prefix sum of x within i's tile."""
    n = int(scalars[0])
    tiles = _tiles(n, grid[0])
    y, x, offsets = _f32(buffers[0], n), _f32(buffers[1], n), _f32(buffers[2], tiles)
    _scan_into(y, x, offsets, n, tiles)


def single_pass(
    grid: Dim3, block: Dim3, buffers: Sequence[Bytes], scalars: Sequence[float]
) -> None:
    """y = inclusive prefix sum of x[:n], in the CUDA kernel's tile order of additions.

    ``buffers[1:3]`` are the CUDA kernel's look-back state and partials: one thread has
    no look-back, so they are left as they are; the tile totals and offsets are its own.
    """
    n = int(scalars[0])
    tiles = _tiles(n, grid[0], PASS_TILE)
    y, x = _f32(buffers[0], n), _f32(buffers[3], n)
    sums, offsets = np.empty(tiles, dtype=np.float32), np.empty(tiles, dtype=np.float32)
    _sums_into(sums, x, n, tiles, PASS_TILE)
    _offsets_into(offsets, sums)
    _scan_into(y, x, offsets, n, tiles, PASS_TILE)


def final_sum(grid: Dim3, block: Dim3, buffers: Sequence[Bytes], scalars: Sequence[float]) -> None:
    """out[0] = sum(partials[:m])."""
    m = int(scalars[0])
    out, partials = _f32(buffers[0], 1), _f32(buffers[1], m)
    out[0] = partials.sum(dtype=np.float64)


def saxpy(grid: Dim3, block: Dim3, buffers: Sequence[Bytes], scalars: Sequence[float]) -> None:
    """out = a * x + y over float32; out may alias x or y."""
    n, a = int(scalars[0]), np.float32(scalars[1])
    out, x, y = _f32(buffers[0], n), _f32(buffers[1], n), _f32(buffers[2], n)
    step = CHUNK_TILES * TILE
    for start in range(0, n, step):
        stop = min(n, start + step)
        out[start:stop] = a * x[start:stop] + y[start:stop]


def add_sub(grid: Dim3, block: Dim3, buffers: Sequence[Bytes], scalars: Sequence[float]) -> None:
    """sum = a + b, difference = a - b over 16 int32 (wrapping, as the CUDA kernel)."""
    total, difference = buffers[0][:64].view(np.int32), buffers[1][:64].view(np.int32)
    a, b = buffers[2][:64].view(np.int32), buffers[3][:64].view(np.int32)
    np.add(a, b, out=total)
    np.subtract(a, b, out=difference)
