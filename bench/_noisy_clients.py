"""The noisy-neighbour clients of bench/contention.py: worker processes on the public client API.

Kinds: ``accy-victim`` (each launch of the short bench.fma kernel waited for, latency
percentiles) and ``accy-aggressor`` (bench.fill, which fills every SM, calibrated to
``target_ms`` a kernel, then pipelined ``depth`` deep: its kernels/s). Each runs as the
tenant of the token its spec carries.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _sharing_kernel import COUNT, max_error
from bench_service import _percentiles

from accy import Client

VICTIM_DELAY = 0.3
"""The victim starts measuring this long after the aggressor started filling the GPU."""


def _client(spec: dict[str, Any], name: str) -> Client:
    return Client(spec["target"], client_name=name, token=spec.get("token"))


def prepare_victim(spec: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    client = _client(spec, "bench-victim")
    session = client.load("bench.fma")
    x_host = np.random.default_rng(0).random(COUNT, dtype=np.float32)
    x, y = client.buffer(x_host), client.empty(COUNT, "f32")
    iters, seconds = int(spec["iters"]), float(spec["seconds"])
    for _ in range(20):
        session.launch([x], [y], wait=True, iters=iters)

    def run() -> dict[str, Any]:
        if spec.get("beside_aggressor"):
            time.sleep(VICTIM_DELAY)
        samples = []
        end = time.perf_counter() + seconds
        while (started := time.perf_counter()) < end:
            session.launch([x], [y], wait=True, iters=iters)
            samples.append(time.perf_counter() - started)
        found = _percentiles(samples) | {"max_error": max_error(y.read(), x_host, iters)}
        client.close()
        return found

    return run


def prepare_aggressor(spec: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    client = _client(spec, "bench-aggressor")
    session = client.load("bench.fill")
    x_host = np.random.default_rng(1).random(COUNT, dtype=np.float32)
    x, y = client.buffer(x_host), client.empty(COUNT, "f32")
    iters = int(spec["iters"])
    target = float(spec.get("target_ms", 0.0)) / 1e3
    depth, seconds = int(spec.get("depth", 4)), float(spec["seconds"])

    def kernel_seconds(count: int = 5) -> float:
        session.launch([x], [y], wait=True, iters=iters)
        started = time.perf_counter()
        for _ in range(count):
            session.launch([x], [y], wait=True, iters=iters)
        return (time.perf_counter() - started) / count

    if target > 0:  # two steps: the kernel's time is about linear in iters
        for _ in range(2):
            iters = max(1, min(10_000_000, int(iters * target / kernel_seconds())))
    took = kernel_seconds()

    def run() -> dict[str, Any]:
        count, started = 0, time.perf_counter()
        end = started + seconds + VICTIM_DELAY
        while time.perf_counter() < end:
            for _ in range(depth):
                session.launch([x], [y], wait=False, iters=iters)
            session.wait()
            count += depth
        elapsed = time.perf_counter() - started
        error = max_error(y.read(), x_host, iters)
        client.close()
        return {
            "per_second": count / elapsed,
            "kernels": count,
            "iters": iters,
            "kernel_ms": took * 1e3,
            "max_error": error,
        }

    return run
