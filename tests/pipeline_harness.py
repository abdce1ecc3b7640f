"""Running a built-in pipeline through the executor on any backend, checked against float64 numpy.

Shared by the host tests (CI) and the CUDA tests (the device): fresh random
inputs, results poisoned with NaN before each run, relative L2 error against a
float64 reference, and every element checked as written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from accyd.backends.base import Backend, DeviceBuffer, Stream
from accyd.catalog import ArtifactFormat, Catalog, Scalar
from accyd.core.executor import (
    PipelineLaunch,
    allocate_intermediates,
    launch_pipeline,
    load_pipeline_artifacts,
)

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]

SIZES = (1, 63, 64, 65, 4095, 4096, 4097, 5000, 2**20 + 3)


@dataclass(frozen=True)
class Case:
    """One built-in pipeline: how to make its inputs and its float64 reference."""

    target: str
    tolerance: float
    operands: Callable[[np.random.Generator, int], list[F32]]
    scalars: Callable[[int], list[Scalar]]
    reference: Callable[[Sequence[F32], Sequence[Scalar]], list[F64]]
    result_sizes: Callable[[int], list[int]]


def _uniform(rng: np.random.Generator, n: int) -> F32:
    return rng.random(n, dtype=np.float32)


SAXPY_A = 1.75

CASES = {
    "accy.kernel.device_scan": Case(
        "accy.kernel.device_scan",
        1e-5,
        lambda rng, n: [_uniform(rng, n)],
        lambda n: [Scalar.u32(n)],
        lambda ops, _: [np.cumsum(ops[0], dtype=np.float64)],
        lambda n: [n],
    ),
    "accy.kernel.reduce_sum": Case(
        "accy.kernel.reduce_sum",
        1e-5,
        lambda rng, n: [_uniform(rng, n)],
        lambda n: [Scalar.u32(n)],
        lambda ops, _: [np.array([ops[0].sum(dtype=np.float64)])],
        lambda n: [1],
    ),
    "accy.kernel.saxpy": Case(
        "accy.kernel.saxpy",
        1e-6,
        lambda rng, n: [_uniform(rng, n) - 0.5, _uniform(rng, n)],
        lambda n: [Scalar.u32(n), Scalar.f32(SAXPY_A)],
        lambda ops, s: [float(s[1].value) * ops[0].astype(np.float64) + ops[1]],
        lambda n: [n],
    ),
}


def relative_error(got: F32, want: F64) -> float:
    assert got.shape == want.shape
    assert np.all(np.isfinite(got)), "some result elements were never written (NaN poison left)"
    norm = float(np.linalg.norm(want))
    return float(np.linalg.norm(got.astype(np.float64) - want)) / (norm or 1.0)


def upload(backend: Backend, array: F32, stream: Stream | None = None) -> DeviceBuffer:
    buffer = backend.allocate_buffer(array.nbytes)
    backend.write(buffer, 0, array.tobytes(), stream)
    return buffer


def download(
    backend: Backend, buffer: DeviceBuffer, count: int, stream: Stream | None = None
) -> F32:
    return np.frombuffer(backend.read(buffer, 0, count * 4, stream), dtype=np.float32).copy()


def run_case(
    backend: Backend,
    catalog: Catalog,
    fmt: ArtifactFormat,
    case: Case,
    n: int,
    *,
    seed: int,
    pooled: bool,
) -> float:
    """Run ``case`` at size ``n``; return the relative error. Frees all it made."""
    rng = np.random.default_rng(seed)
    pipeline = catalog.find_pipeline(case.target)
    inputs = case.operands(rng, n)
    scalars = case.scalars(n)
    stream = backend.create_stream() if pooled else None
    operands = [upload(backend, array, stream) for array in inputs]
    sizes = case.result_sizes(n)
    results = [upload(backend, np.full(size, np.nan, dtype=np.float32), stream) for size in sizes]
    try:
        request = PipelineLaunch(
            pipeline, catalog.registry, fmt, operands, results, scalars, stream=stream
        )
        if pooled:
            with (
                load_pipeline_artifacts(backend, pipeline, catalog.registry, fmt) as pool,
                allocate_intermediates(backend, pipeline, scalars) as scratch,
            ):
                launch_pipeline(
                    backend,
                    PipelineLaunch(
                        pipeline,
                        catalog.registry,
                        fmt,
                        operands,
                        results,
                        scalars,
                        intermediates=scratch.buffers,
                        artifacts=pool,
                        stream=stream,
                    ),
                )
                backend.synchronize(stream)
        else:
            launch_pipeline(backend, request)
        got = [
            download(backend, buffer, size, stream)
            for buffer, size in zip(results, sizes, strict=True)
        ]
    finally:
        for buffer in (*operands, *results):
            backend.destroy(buffer)
        if stream is not None:
            backend.destroy_stream(stream)
    want = case.reference(inputs, scalars)
    return max(relative_error(g, w) for g, w in zip(got, want, strict=True))
