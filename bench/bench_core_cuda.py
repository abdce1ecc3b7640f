"""Pipeline core on one CUDA device: scan bandwidth, launch overhead, cold and warm pool loads.

Run on a machine with a GPU, from the repository root:

    PYTHONPATH=server:client python bench/bench_core_cuda.py [--json out.json]

(a) accy.kernel.device_scan at n = 2^28 float32 against CuPy's cumsum (default and
    with the CUB accelerator) and a device-to-device copy of the same bytes, as
    effective bandwidth 2n*4 bytes / time, timed with CUDA events (median of the
    per-rep times of back-to-back reps after warm-up);
(b) one pooled device_scan launch at n = 5000: through the executor, through
    ``CudaBackend.launch``, and straight through cuda-python with pre-packed or
    (values, types) arguments: p50/p99 of launch + synchronize, and enqueue time;
(c) loading the device_scan pool with an empty kernel cache (NVRTC compiles) and a
    warm one (disk cache).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from accyd.backends.base import DeviceBuffer, LaunchRequest, Stream
from accyd.backends.cuda import CudaBackend, cuda_available
from accyd.backends.cuda.compile_cache import CompileCache
from accyd.catalog import ArtifactFormat, Catalog, Scalar, load_catalog
from accyd.core.executor import (
    PipelineLaunch,
    allocate_intermediates,
    launch_pipeline,
    load_pipeline_artifacts,
)

FMT = ArtifactFormat.CUDA_CPP
SCAN = "accy.kernel.device_scan"


def cu() -> Any:
    from cuda.bindings import driver

    return driver


def ok(result: Any) -> Any:
    err = result[0]
    if int(err):
        raise RuntimeError(f"CUDA call failed: {err}")
    return result[1] if len(result) == 2 else None


class Timer:
    """Back-to-back reps on one stream, a timing event between each; per-rep device times."""

    def __init__(self, stream_handle: Any) -> None:
        self.stream = stream_handle
        self.flags = cu().CUevent_flags.CU_EVENT_DEFAULT

    def run(self, body: Callable[[], None], reps: int, warmup: int) -> list[float]:
        d = cu()
        for _ in range(warmup):
            body()
        ok(d.cuStreamSynchronize(self.stream))
        events = [ok(d.cuEventCreate(self.flags)) for _ in range(reps + 1)]
        ok(d.cuEventRecord(events[0], self.stream))
        for i in range(reps):
            body()
            ok(d.cuEventRecord(events[i + 1], self.stream))
        ok(d.cuStreamSynchronize(self.stream))
        times = [ok(d.cuEventElapsedTime(events[i], events[i + 1])) for i in range(reps)]
        for event in events:
            d.cuEventDestroy(event)
        return [float(t) for t in times]  # milliseconds


def upload(be: CudaBackend, array: np.ndarray) -> DeviceBuffer:
    buffer = be.allocate_buffer(array.nbytes)
    be.write(buffer, 0, memoryview(array), None)
    return buffer


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


# -- (c) cold and warm pool loads -------------------------------------------------------------


def pool_loads(be: CudaBackend, catalog: Catalog, reps: int) -> dict[str, Any]:
    pipeline = catalog.find_pipeline(SCAN)

    def load(cache_dir: str) -> tuple[float, int, int]:
        be.cache = CompileCache(cache_dir)
        started = time.perf_counter()
        pool = load_pipeline_artifacts(be, pipeline, catalog.registry, FMT)
        elapsed = time.perf_counter() - started
        pool.close()
        return elapsed * 1e3, be.cache.stats.misses, be.cache.stats.hits

    saved = be.cache
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as root:
        first, misses, hits = load(os.path.join(root, "first"))
        results["first_in_process_ms"] = first
        results["first_in_process_compiles"] = misses
        colds, warms = [], []
        for i in range(reps):
            cold, misses, hits = load(os.path.join(root, f"cold{i}"))
            colds.append(cold)
            results["cold_compiles"], results["cold_hits"] = misses, hits
            warm, misses, hits = load(os.path.join(root, f"cold{i}"))
            warms.append(warm)
            results["warm_compiles"], results["warm_hits"] = misses, hits
        results["cold_ms"] = statistics.median(colds)
        results["warm_ms"] = statistics.median(warms)
    be.cache = saved
    return results


# -- (a) scan bandwidth ----------------------------------------------------------------------------


def scan_bandwidth(
    be: CudaBackend, catalog: Catalog, n: int, reps: int, warmup: int
) -> dict[str, Any]:
    d = cu()
    pipeline = catalog.find_pipeline(SCAN)
    scalars = [Scalar.u32(n)]
    stream = be.create_stream()
    rng = np.random.default_rng(1)
    x = rng.random(n, dtype=np.float32)
    dx = upload(be, x)
    dy = be.allocate_buffer(n * 4)
    nbytes = 2 * n * 4
    out: dict[str, Any] = {"n": n}
    timer = Timer(stream.native)
    with (
        load_pipeline_artifacts(be, pipeline, catalog.registry, FMT) as pool,
        allocate_intermediates(be, pipeline, scalars) as scratch,
    ):
        request = PipelineLaunch(
            pipeline,
            catalog.registry,
            FMT,
            [dx],
            [dy],
            scalars,
            intermediates=scratch.buffers,
            artifacts=pool,
            stream=stream,
        )
        ours = timer.run(lambda: launch_pipeline(be, request), reps, warmup)
        out["accy_ms"] = statistics.median(ours)

        # Per-stage breakdown: direct launches with events between the stages.
        plans = []
        for index, stage_entry in enumerate(pool.entries):
            entry = pipeline.stage_entries(catalog.registry, FMT)[index]
            stage = pipeline.stages[index]
            stage_scalars = [expr.evaluate(scalars) for expr in stage.scalars]
            refs = {"operand": [dx], "result": [dy], "intermediate": list(scratch.buffers)}
            buffers = [refs[ref.role.value][ref.index] for ref in stage.buffers]
            plans.append(
                LaunchRequest(
                    stage_entry.artifact,
                    stage_entry.loaded,
                    buffers,
                    stage_scalars,
                    entry.launch.resolve(stage_scalars),
                    stream,
                )
            )
        stage_times: list[list[float]] = [[] for _ in plans]
        events = [
            ok(d.cuEventCreate(d.CUevent_flags.CU_EVENT_DEFAULT)) for _ in range(len(plans) + 1)
        ]
        for _ in range(reps):
            ok(d.cuEventRecord(events[0], stream.native))
            for i, plan in enumerate(plans):
                be.launch(plan)
                ok(d.cuEventRecord(events[i + 1], stream.native))
            ok(d.cuStreamSynchronize(stream.native))
            for i in range(len(plans)):
                stage_times[i].append(float(ok(d.cuEventElapsedTime(events[i], events[i + 1]))))
        for event in events:
            d.cuEventDestroy(event)
        out["stages_ms"] = {
            stage.target.rsplit(".", 1)[-1]: statistics.median(times)
            for stage, times in zip(pipeline.stages, stage_times, strict=True)
        }
        be.synchronize(stream)
        got = np.empty(n, dtype=np.float32)
        be.read_into(dy, 0, got, stream)
    want = np.cumsum(x, dtype=np.float64)
    out["accy_rel_err"] = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    del got, want

    copy = timer.run(
        lambda: ok(d.cuMemcpyDtoDAsync(dy.address, dx.address, n * 4, stream.native)), reps, warmup
    )
    out["copy_ms"] = statistics.median(copy)

    try:
        import cupy

        out.update(cupy_cumsum(cupy, be, dx, n, reps, warmup))
    except Exception as error:  # CuPy missing or broken: report, don't fail the run
        out["cupy_error"] = repr(error)

    for key in ("accy", "copy", "cupy_default", "cupy_cub"):
        if f"{key}_ms" in out:
            out[f"{key}_TBps"] = nbytes / (out[f"{key}_ms"] * 1e-3) / 1e12
    be.destroy(dx)
    be.destroy(dy)
    be.destroy_stream(stream)
    return out


def cupy_cumsum(
    cupy: Any, be: CudaBackend, dx: DeviceBuffer, n: int, reps: int, warmup: int
) -> dict[str, Any]:
    out: dict[str, Any] = {"cupy_version": cupy.__version__}
    memory = cupy.cuda.UnownedMemory(dx.address, n * 4, be)
    cx = cupy.ndarray((n,), dtype=cupy.float32, memptr=cupy.cuda.MemoryPointer(memory, 0))
    cy = cupy.empty_like(cx)
    stream = cupy.cuda.Stream(non_blocking=True)
    try:
        from cupy._core import _accelerator

        saved = _accelerator.get_routine_accelerators()
    except Exception:
        _accelerator, saved = None, None
    variants = [("cupy_default", [])]
    if _accelerator is not None:
        variants.append(("cupy_cub", ["cub"]))
    with stream:
        for name, accelerators in variants:
            if _accelerator is not None:
                _accelerator.set_routine_accelerators(accelerators)
            timer = Timer(cu().CUstream(stream.ptr))
            times = timer.run(lambda: cupy.cumsum(cx, out=cy), reps, warmup)
            out[f"{name}_ms"] = statistics.median(times)
            ref = cupy.cumsum(cx.astype(cupy.float64))
            out[f"{name}_rel_err"] = float(
                cupy.linalg.norm(cy.astype(cupy.float64) - ref) / cupy.linalg.norm(ref)
            )
            del ref
        if _accelerator is not None:
            _accelerator.set_routine_accelerators(saved)
    stream.synchronize()
    cupy.get_default_memory_pool().free_all_blocks()
    return out


# -- (b) launch overhead ---------------------------------------------------------------------------


def launch_overhead(be: CudaBackend, catalog: Catalog, n: int, iterations: int) -> dict[str, Any]:
    d = cu()
    pipeline = catalog.find_pipeline(SCAN)
    scalars = [Scalar.u32(n)]
    stream: Stream = be.create_stream()
    dx = upload(be, np.random.default_rng(2).random(n, dtype=np.float32))
    dy = be.allocate_buffer(n * 4)
    out: dict[str, Any] = {"n": n, "iterations": iterations}
    with (
        load_pipeline_artifacts(be, pipeline, catalog.registry, FMT) as pool,
        allocate_intermediates(be, pipeline, scalars) as scratch,
    ):
        request = PipelineLaunch(
            pipeline,
            catalog.registry,
            FMT,
            [dx],
            [dy],
            scalars,
            intermediates=scratch.buffers,
            artifacts=pool,
            stream=stream,
        )
        requests = []
        for index, stage in enumerate(pipeline.stages):
            entry = pipeline.stage_entries(catalog.registry, FMT)[index]
            stage_scalars = [expr.evaluate(scalars) for expr in stage.scalars]
            refs = {"operand": [dx], "result": [dy], "intermediate": list(scratch.buffers)}
            requests.append(
                LaunchRequest(
                    pool.entries[index].artifact,
                    pool.entries[index].loaded,
                    [refs[r.role.value][r.index] for r in stage.buffers],
                    stage_scalars,
                    entry.launch.resolve(stage_scalars),
                    stream,
                )
            )

        handle = stream.native
        raw = []
        keep: list[Any] = []
        for req in requests:
            kernel = req.loaded.native
            values = [b.address for b in req.buffers] + [int(s.value) for s in req.scalars]
            storage = (ctypes.c_uint64 * len(values))(*values)  # u32 scalars: low half, LE
            params = (ctypes.c_void_p * len(values))(
                *(ctypes.addressof(storage) + 8 * i for i in range(len(values)))
            )
            keep += [storage, params]
            raw.append(
                (kernel.function, req.geometry.grid, req.geometry.block, ctypes.addressof(params))
            )
        tuples = []
        for req in requests:
            kernel = req.loaded.native
            vals = tuple(b.address for b in req.buffers) + tuple(int(s.value) for s in req.scalars)
            types = (ctypes.c_void_p,) * len(req.buffers) + (ctypes.c_uint,) * len(req.scalars)
            tuples.append((kernel.function, req.geometry.grid, req.geometry.block, (vals, types)))

        def executor() -> None:
            launch_pipeline(be, request)

        def backend_launch() -> None:
            for req in requests:
                be.launch(req)

        def prepacked() -> None:
            for f, g, b, p in raw:
                ok(d.cuLaunchKernel(f, g[0], g[1], g[2], b[0], b[1], b[2], 0, handle, p, 0))

        def value_types() -> None:
            for f, g, b, p in tuples:
                ok(d.cuLaunchKernel(f, g[0], g[1], g[2], b[0], b[1], b[2], 0, handle, p, 0))

        def sync() -> None:
            ok(d.cuStreamSynchronize(handle))

        variants = {
            "executor": executor,
            "backend.launch x3": backend_launch,
            "cuda-python pre-packed x3": prepacked,
            "cuda-python (values, types) x3": value_types,
        }
        for name, body in variants.items():
            for _ in range(200):
                body()
                sync()
            total, enqueue = [], []
            for _ in range(iterations):
                t0 = time.perf_counter_ns()
                body()
                t1 = time.perf_counter_ns()
                sync()
                t2 = time.perf_counter_ns()
                enqueue.append((t1 - t0) / 1e3)
                total.append((t2 - t0) / 1e3)
            out[name] = {
                "p50_us": pct(total, 50),
                "p99_us": pct(total, 99),
                "enqueue_p50_us": pct(enqueue, 50),
                "enqueue_per_launch_us": pct(enqueue, 50) / 3,
            }
        # Enqueue throughput without waiting: many pipelines back to back, one sync at the end.
        for name, body in variants.items():
            count = 2000
            t0 = time.perf_counter_ns()
            for _ in range(count):
                body()
            t1 = time.perf_counter_ns()
            sync()
            out[name]["stream_enqueue_per_launch_us"] = (t1 - t0) / 1e3 / count / 3
        got = np.frombuffer(be.read(dy, 0, n * 4, stream), dtype=np.float32)
        want = np.cumsum(
            np.frombuffer(be.read(dx, 0, n * 4, stream), dtype=np.float32), dtype=np.float64
        )
        out["rel_err"] = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    del keep
    be.destroy(dx)
    be.destroy(dy)
    be.destroy_stream(stream)
    return out


# -- report ----------------------------------------------------------------------------------------


def driver_string(be: CudaBackend) -> str:
    version = be.driver_version
    text = f"CUDA {version // 1000}.{(version % 1000) // 10}"
    try:
        line = Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
        for word in line.split():
            if word.count(".") >= 1 and word.replace(".", "").isdigit():
                return f"{word} ({text})"
    except OSError:
        pass
    return text


def table(results: dict[str, Any]) -> str:
    a, b, c = results["scan"], results["launch"], results["pool_load"]
    rows = ["| measurement | value |", "| --- | --- |"]
    rows.append(
        f"| device_scan n=2^28, accy (executor, pooled) | {a['accy_ms']:.3f} ms, "
        f"{a['accy_TBps']:.2f} TB/s effective |"
    )
    stages = a["stages_ms"]
    rows.append(
        f"| stages: {' / '.join(stages)} | {' / '.join(f'{ms:.3f}' for ms in stages.values())} ms |"
    )
    for key, label in (
        ("cupy_default", "CuPy cumsum (default)"),
        ("cupy_cub", "CuPy cumsum (CUB)"),
    ):
        if f"{key}_ms" in a:
            rows.append(
                f"| {label} | {a[f'{key}_ms']:.3f} ms, {a[f'{key}_TBps']:.2f} TB/s; "
                f"accy is {a[f'{key}_ms'] / a['accy_ms']:.2f}x faster |"
            )
    if "cupy_error" in a:
        rows.append(f"| CuPy | not measured: {a['cupy_error']} |")
    share = a["accy_TBps"] / a["copy_TBps"]
    rows.append(
        f"| device-to-device copy of the same bytes | {a['copy_ms']:.3f} ms, "
        f"{a['copy_TBps']:.2f} TB/s; accy at {share:.0%} |"
    )
    for name in (
        "executor",
        "backend.launch x3",
        "cuda-python pre-packed x3",
        "cuda-python (values, types) x3",
    ):
        v = b[name]
        rows.append(
            f"| n=5000, {name}: launch+sync p50 / p99; enqueue per launch | "
            f"{v['p50_us']:.1f} / {v['p99_us']:.1f} µs; "
            f"{v['enqueue_per_launch_us']:.2f} µs "
            f"({v['stream_enqueue_per_launch_us']:.2f} µs streaming) |"
        )
    rows.append(
        f"| device_scan pool load, first in process (loads NVRTC) | "
        f"{c['first_in_process_ms']:.1f} ms |"
    )
    rows.append(
        f"| pool load, empty cache ({c['cold_compiles']} compile, {c['cold_hits']} hits) | "
        f"{c['cold_ms']:.1f} ms |"
    )
    rows.append(f"| pool load, warm disk cache ({c['warm_hits']} hits) | {c['warm_ms']:.2f} ms |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="write every number here")
    parser.add_argument("--n", type=int, default=2**28, help="scan size (default 2^28)")
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=3000, help="launch-overhead iterations")
    args = parser.parse_args()
    if not cuda_available():
        print("no CUDA device here", file=sys.stderr)
        return 2
    catalog = load_catalog()
    with tempfile.TemporaryDirectory() as cache, CudaBackend(0, cache_dir=cache) as be:
        results: dict[str, Any] = {
            "device": be.device_name,
            "driver": driver_string(be),
            "arch": be.arch,
            "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d"),
        }
        results["pool_load"] = pool_loads(be, catalog, reps=3)
        results["scan"] = scan_bandwidth(be, catalog, args.n, args.reps, args.warmup)
        results["launch"] = launch_overhead(be, catalog, 5000, args.iterations)
        results["memory_in_use_at_end"] = be.memory_in_use()
    text = table(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print(f"\n{results['device']}, driver {results['driver']}, {results['arch']}\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
