"""CUDA graph replay against per-stage launches, for the built-in pipelines (issue 11, item 3).

For each built-in pipeline at a small size, on one stream of the CUDA backend:
the pipeline's stages launched one by one plus a synchronize, the same stages
replayed as one prepared graph (``Backend.prepare``) plus a synchronize, and one
single-kernel launch plus a synchronize as the yardstick; p50 of many, after a
warm-up. Prints a table last.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from accyd.backends.cuda.backend import CudaBackend
from accyd.catalog import ArtifactFormat, load_catalog
from accyd.catalog.dtypes import Scalar
from accyd.core.executor import (
    PipelineLaunch,
    allocate_intermediates,
    launch_pipeline,
    load_pipeline_artifacts,
    plan_launch,
)
from accyd.core.prepared import prepare_pipeline

SCALARS = {
    "accy.kernel.device_scan": lambda n: [Scalar.u32(n)],
    "accy.kernel.reduce_sum": lambda n: [Scalar.u32(n)],
    "accy.kernel.saxpy": lambda n: [Scalar.u32(n), Scalar.f32(2.0)],
}


def p50_us(run: Callable[[], None], sync: Callable[[], None], count: int) -> float:
    for _ in range(100):
        run()
        sync()
    times = []
    for _ in range(count):
        start = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--count", type=int, default=3000)
    args = parser.parse_args()
    backend = CudaBackend(0, cache_dir=Path(tempfile.mkdtemp()))
    catalog = load_catalog()
    stream = backend.create_stream()
    fmt = ArtifactFormat.CUDA_CPP
    rows = []
    single = None
    for target, scalars_of in SCALARS.items():
        pipeline = catalog.find_pipeline(target)
        scalars = scalars_of(args.n)
        pool = load_pipeline_artifacts(backend, pipeline, catalog.registry, fmt)
        scratch = allocate_intermediates(backend, pipeline, scalars)
        ops = [backend.allocate_buffer(4 * args.n, zero=True) for _ in pipeline.operands]
        res = [backend.allocate_buffer(4 * args.n, zero=True) for _ in pipeline.results]
        request = PipelineLaunch(
            pipeline=pipeline,
            registry=catalog.registry,
            format=fmt,
            operands=ops,
            results=res,
            runtime_scalars=scalars,
            intermediates=scratch.buffers,
            artifacts=pool,
            stream=stream,
        )
        plan = plan_launch(pipeline, catalog.registry, fmt, ops, res, scalars)
        graph = prepare_pipeline(backend, request, plan)

        def staged(request: PipelineLaunch = request) -> None:
            launch_pipeline(backend, request)

        def replay(graph: object = graph) -> None:
            graph.launch(stream)  # type: ignore[attr-defined]

        def sync() -> None:
            backend.synchronize(stream)

        per_stage = p50_us(staged, sync, args.count)
        graphed = p50_us(replay, sync, args.count)
        if target == "accy.kernel.saxpy":
            single = per_stage  # one stage: one kernel launch plus synchronize
        rows.append((target, len(pipeline.stages), per_stage, graphed))
        graph.close()
        scratch.close()
        pool.close()
        for buffer in (*ops, *res):
            backend.destroy(buffer)
    backend.destroy_stream(stream)
    backend.close()
    assert single is not None
    print(f"\nn = {args.n}; one single-kernel launch + synchronize (saxpy): {single:.1f} µs\n")
    print(
        "| pipeline | stages | per-stage launches + sync, p50 | one graph + sync, p50 | "
        "graph / single kernel |"
    )
    print("| --- | --- | --- | --- | --- |")
    for target, stages, per_stage, graphed in rows:
        print(
            f"| {target} | {stages} | {per_stage:.1f} µs | {graphed:.1f} µs | "
            f"{graphed / single:.2f} |"
        )


if __name__ == "__main__":
    main()
