"""The daemon's own cost per waited launch, without gRPC: where a Launch round trip's time goes.

Run from the repository root:

    python bench/bench_launch_path.py [--backend auto|cuda|host] [--n 5000] [--count 5000]

In one process, on one device, for accy.kernel.device_scan with scratch
allocated once, it times per waited launch (median of blocks):

- ``daemon``: ``Daemon.launch`` then ``Daemon.wait_launch`` (ids, quotas,
  hazards, marks, the launch log) on a thread, as the blocking fallback does;
- ``launcher``: the service's ``Launcher.submit`` + ``finish`` on an event loop
  (request fields, the spin-then-notify wait, metrics, the reply message), for
  spin budgets of 0 (notification only) and the default.

What a launch over gRPC costs beyond ``launcher`` is the transport's (compare
``bench/profile_launch.py``'s streaming echo; the executor's own share is in
``bench/bench_core_cuda.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable

import numpy as np

from accy._table import markdown
from accy.protocol.launch.v1 import launch_pb2 as pb
from accyd.backends.select import make_backend
from accyd.catalog import load_catalog
from accyd.catalog.dtypes import DType, Scalar
from accyd.core.daemon import Daemon
from accyd.doors.grpc.launches import Launcher
from accyd.logs import configure_logging
from accyd.scheduling import DeviceWork
from accyd.settings.config import Config
from accyd.telemetry.metrics import Metrics

SCAN = "accy.kernel.device_scan"


def _blocks(call: Callable[[], object], count: int) -> float:
    """Median over 10 blocks of the mean time per call, in µs."""
    for _ in range(max(50, count // 10)):
        call()
    block = max(1, count // 10)
    means = []
    for _ in range(10):
        started = time.perf_counter()
        for _ in range(block):
            call()
        means.append((time.perf_counter() - started) / block)
    return statistics.median(means) * 1e6


async def _async_blocks(call: Callable[[], Awaitable[object]], count: int) -> float:
    for _ in range(max(50, count // 10)):
        await call()
    block = max(1, count // 10)
    means = []
    for _ in range(10):
        started = time.perf_counter()
        for _ in range(block):
            await call()
        means.append((time.perf_counter() - started) / block)
    return statistics.median(means) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["auto", "cuda", "host"], default="auto")
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--count", type=int, default=5000)
    args = parser.parse_args()
    configure_logging(level="warning")
    backend = make_backend(args.backend)
    daemon = Daemon(load_catalog(), {0: backend})
    client = daemon.attach("bench").id
    session = daemon.load_pipeline(client, SCAN).session_id
    scalars = {"n": Scalar.u32(args.n)}
    daemon.allocate_intermediates(client, session, scalars)
    x = daemon.allocate_buffer(client, 4 * args.n, DType.F32).id
    y = daemon.allocate_buffer(client, 4 * args.n, DType.F32).id
    writer = daemon.open_write(client, x)
    writer.write(0, np.random.default_rng(0).random(args.n, dtype=np.float32).tobytes())
    writer.finish()
    rows: list[list[str]] = []

    def through_daemon() -> None:
        ticket = daemon.launch(client, session, [x], [y], scalars)
        daemon.wait_launch(client, session, ticket.launch_id)

    rows.append(
        ["Daemon.launch + wait_launch (blocking)", f"{_blocks(through_daemon, args.count):.1f} µs"]
    )
    request = pb.LaunchRequest(
        session_id=session,
        operands=[x],
        results=[y],
        runtime_scalars={"n": pb.Scalar(u32=args.n)},
        wait=True,
    )
    work = DeviceWork(4)

    async def through_launcher(spin: float) -> float:
        launcher = Launcher(daemon, work, Metrics(), spin_seconds=spin)

        async def one() -> object:
            pending = await launcher.submit(client, request, time.perf_counter())
            return await launcher.finish(client, pending)

        return await _async_blocks(one, args.count)

    default_spin = Config().launch_spin_seconds
    for spin in (0.0, default_spin):
        took = asyncio.run(through_launcher(spin))
        rows.append([f"Launcher.submit + finish, spin {spin * 1e6:.0f} µs", f"{took:.1f} µs"])
    daemon.close()
    work.close()
    print(f"\n{backend.kind.value} backend on {backend.device_name}; device_scan n={args.n}\n")
    print(markdown(["path (one process, no gRPC)", "per waited launch"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
