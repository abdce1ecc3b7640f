"""The noisy-neighbour clients of bench/contention.py: worker processes, through accy or raw.

Kinds: ``accy-victim`` (each launch of the short bench.fma kernel waited for, latency
percentiles) and ``accy-aggressor`` (bench.fill, which fills every SM, calibrated to
``target_ms`` a kernel, then pipelined ``depth`` deep: its kernels/s), each the tenant of
the token its spec carries; ``cuda-victim`` and ``cuda-aggressor``, the same kernels from
fma.cu launched raw on a context of their own (cuda.bindings, one stream each), for the
series under MPS, where the aggressor's spec may carry ``mps_thread_percentage``
(``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, set before its context is made).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _sharing_kernel import COUNT, max_error
from bench_service import _percentiles

from accy import Client

VICTIM_DELAY = 0.3
"""The victim starts measuring this long after the aggressor started filling the GPU."""
FILL_GRID = 8448
"""bench.fill's blocks (bench/catalog/bench.toml): every SM of an H200 four times over."""


def _client(spec: dict[str, Any], name: str) -> Client:
    return Client(spec["target"], client_name=name, token=spec.get("token"))


def _victim_samples(spec: dict[str, Any], waited_launch: Callable[[], None]) -> dict[str, Any]:
    """Each waited launch's seconds for ``spec["seconds"]``, as percentiles."""
    if spec.get("beside_aggressor"):
        time.sleep(VICTIM_DELAY)
    samples = []
    end = time.perf_counter() + float(spec["seconds"])
    while (started := time.perf_counter()) < end:
        waited_launch()
        samples.append(time.perf_counter() - started)
    return _percentiles(samples)


def _calibrated(spec: dict[str, Any], kernel_seconds: Callable[[int], float]) -> tuple[int, float]:
    """The aggressor's iters for a kernel of about ``target_ms`` (0: as given), and its
    seconds: two steps, the kernel's time being about linear in iters."""
    iters, target = int(spec["iters"]), float(spec.get("target_ms", 0.0)) / 1e3
    if target > 0:
        for _ in range(2):
            iters = max(1, min(10_000_000, int(iters * target / kernel_seconds(iters))))
    return iters, kernel_seconds(iters)


def _aggressor_rate(
    spec: dict[str, Any], launch: Callable[[], None], wait: Callable[[], None]
) -> dict[str, Any]:
    """``depth`` launches then a wait, over and over until the victim is done: kernels/s."""
    depth, seconds = int(spec.get("depth", 4)), float(spec["seconds"])
    count, started = 0, time.perf_counter()
    end = started + seconds + VICTIM_DELAY
    while time.perf_counter() < end:
        for _ in range(depth):
            launch()
        wait()
        count += depth
    elapsed = time.perf_counter() - started
    return {"per_second": count / elapsed, "kernels": count}


def _mean_seconds(waited_launch: Callable[[], None], count: int = 5) -> float:
    waited_launch()
    started = time.perf_counter()
    for _ in range(count):
        waited_launch()
    return (time.perf_counter() - started) / count


def prepare_victim(spec: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    client = _client(spec, "bench-victim")
    session = client.load("bench.fma")
    x_host = np.random.default_rng(0).random(COUNT, dtype=np.float32)
    x, y = client.buffer(x_host), client.empty(COUNT, "f32")
    iters = int(spec["iters"])

    def waited_launch() -> None:
        session.launch([x], [y], wait=True, iters=iters)

    for _ in range(20):
        waited_launch()

    def run() -> dict[str, Any]:
        found = _victim_samples(spec, waited_launch)
        found["max_error"] = max_error(y.read(), x_host, iters)
        client.close()
        return found

    return run


def prepare_aggressor(spec: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    client = _client(spec, "bench-aggressor")
    session = client.load("bench.fill")
    x_host = np.random.default_rng(1).random(COUNT, dtype=np.float32)
    x, y = client.buffer(x_host), client.empty(COUNT, "f32")
    iters, took = _calibrated(
        spec, lambda n: _mean_seconds(lambda: session.launch([x], [y], wait=True, iters=n))
    )

    def run() -> dict[str, Any]:
        found = _aggressor_rate(
            spec, lambda: session.launch([x], [y], wait=False, iters=iters), session.wait
        )
        error = max_error(y.read(), x_host, iters)
        client.close()
        return found | {"iters": iters, "kernel_ms": took * 1e3, "max_error": error}

    return run


def prepare_cuda_victim(spec: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    from _sharing_cuda import Rig

    rig = Rig()
    stream = rig.stream()
    iters = int(spec["iters"])
    launch, sync = rig.launcher(iters, stream), rig.synchronizer(stream)

    def waited_launch() -> None:
        launch()
        sync()

    for _ in range(20):
        waited_launch()

    def run() -> dict[str, Any]:
        found = _victim_samples(spec, waited_launch)
        return found | {"max_error": rig.check_result(iters)}

    return run


def prepare_cuda_aggressor(spec: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    from _sharing_cuda import Rig

    if spec.get("mps_thread_percentage") is not None:
        os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(spec["mps_thread_percentage"])
    rig = Rig()
    stream = rig.stream()
    sync = rig.synchronizer(stream)

    def fill(n: int) -> Callable[[], None]:
        return rig.launcher(n, stream, entry="accy_bench_fill", grid=FILL_GRID)

    def waited(n: int) -> float:
        launch = fill(n)

        def once() -> None:
            launch()
            sync()

        return _mean_seconds(once)

    iters, took = _calibrated(spec, waited)

    def run() -> dict[str, Any]:
        found = _aggressor_rate(spec, fill(iters), sync)
        error = rig.check_result(iters)
        return found | {"iters": iters, "kernel_ms": took * 1e3, "max_error": error}

    return run
