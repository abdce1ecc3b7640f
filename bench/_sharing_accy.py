"""The sharing benchmark's accy clients: worker processes on the public client API only.

Kinds: ``accy-rate`` (launches not waited for, the session waited on every 16),
``accy-rtt`` (waited launches of the tiny kernel, optionally interleaved with a
raw streaming gRPC echo of the same size) and ``accy-scan`` (device_scan waited).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _sharing_kernel import COUNT, PIPELINE, SYNC_EVERY, max_error
from bench_service import _channel, _percentiles, _StreamEcho, _timed

from accy import Client
from accy.protocol.launch.v1 import launch_pb2 as pb

SCAN = "accy.kernel.device_scan"
BLOCKS = 10
"""Round-trip series interleave in this many blocks, so drift hits them alike."""


class _Fma:
    """A client, a bench.fma session and its x and y."""

    def __init__(self, target: str, name: str) -> None:
        self.client = Client(target, client_name=name)
        self.session = self.client.load(PIPELINE)
        self.x_host = np.random.default_rng(0).random(COUNT, dtype=np.float32)
        self.x = self.client.buffer(self.x_host)
        self.y = self.client.empty(COUNT, "f32")

    def launch(self, iters: int, wait: bool) -> None:
        self.session.launch([self.x], [self.y], wait=wait, iters=iters)

    def check(self, iters: int) -> float:
        """Largest difference of y from the host's computation; raises past the tolerance."""
        self.session.wait()
        return max_error(self.y.read(), self.x_host, iters)

    def request_bytes(self, iters: int) -> int:
        """Size of the LaunchRequest one waited launch sends (for an echo of the same size)."""
        return pb.LaunchRequest(
            session_id=self.session.id,
            operands=[self.x.id],
            results=[self.y.id],
            runtime_scalars={"iters": pb.Scalar(u32=iters)},
            wait=True,
        ).ByteSize()


def prepare_rate(spec: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """Launches with ``wait=False`` as fast as they go, the session waited on every 16 (or
    ``sync_every``: a remote client pipelines deeper than one round trip per 16); with
    ``waited``, every launch waited for (``wait=True``), as an inference client's loop does."""
    fma = _Fma(spec["target"], f"bench-rate-{spec['index']}")
    iters, seconds = int(spec["iters"]), float(spec["seconds"])
    waited = bool(spec.get("waited", False))
    every = 1 if waited else int(spec.get("sync_every", SYNC_EVERY))
    for _ in range(every):
        fma.launch(iters, wait=waited)
    fma.session.wait()

    def run() -> dict[str, Any]:
        count, started = 0, time.perf_counter()
        end = started + seconds
        took: list[float] = []  # each waited launch's latency
        while (now := time.perf_counter()) < end:
            for _ in range(every):
                fma.launch(iters, wait=waited)
            if waited:
                took.append(time.perf_counter() - now)
            else:
                fma.session.wait()
            count += every
        elapsed = time.perf_counter() - started
        fma.check(iters)
        fma.client.close()
        found = {"kernels": count, "seconds": elapsed, "per_second": count / elapsed}
        return found | ({"latency": _percentiles(took)} if took else {})

    return run


def prepare_rtt(spec: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """Waited launches of the tiny kernel, p50/p99; with ``echo``, against a streaming echo."""
    fma = _Fma(spec["target"], "bench-rtt")
    iters, iterations = int(spec["iters"]), int(spec["iterations"])
    series: dict[str, Callable[[], object]] = {"launch": lambda: fma.launch(iters, wait=True)}
    echo: _StreamEcho | None = None
    size = fma.request_bytes(iters)
    if spec.get("echo"):
        echo = streamed = _StreamEcho(_channel(spec["echo"]))
        payload = bytes(size)
        series["stream_echo"] = lambda: streamed(payload)

    def run() -> dict[str, Any]:
        samples: dict[str, list[float]] = {name: [] for name in series}
        block = max(1, iterations // BLOCKS)
        for _ in range(BLOCKS):
            for name, call in series.items():
                samples[name] += _timed(call, block, warmup=5)
        if echo is not None:
            echo.close()
        found: dict[str, Any] = {name: _percentiles(v) for name, v in samples.items()}
        found["request_bytes"] = size
        found["max_error"] = fma.check(iters)
        fma.client.close()
        return found

    return run


def prepare_scan(spec: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """device_scan at ``n``, scratch allocated once, launched and waited: p50/p99 (after
    ``warmup`` launches, default 20)."""
    n, iterations, warmup = int(spec["n"]), int(spec["iterations"]), int(spec.get("warmup", 20))
    client = Client(spec["target"], client_name="bench-scan")
    session = client.load(SCAN)
    session.allocate_intermediates(n=n)
    data = np.random.default_rng(1).random(n, dtype=np.float32)
    x, y = client.buffer(data), client.empty(n, "f32")

    def launch() -> None:
        session.launch([x], [y], n=n)

    def run() -> dict[str, Any]:
        found = _percentiles(_timed(launch, iterations, warmup=warmup))
        want = np.cumsum(data, dtype=np.float64)
        error = float(np.linalg.norm(y.read() - want) / np.linalg.norm(want))
        if not error < 1e-5:
            raise RuntimeError(f"device_scan relative error {error}")
        client.close()
        return found | {"n": n, "rel_err": error}

    return run
