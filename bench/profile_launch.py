"""Where a Launch round trip spends the daemon's CPU: per-call CPU against an echo, and a profile.

Run from the repository root:

    python bench/profile_launch.py [--backend auto|cuda|host] [--n 5000] [--spy PATH-TO-PY-SPY]

It starts ``accyd serve``, measures the daemon process's CPU time per call
(utime + stime from /proc) and wall time for a raw gRPC echo server (unary and
bidi ping-pong), the health check, GetStatus, and Launch with and without
waiting through raw stubs (no client-library cost), then a waited launch
through the client library (its same-host ring). With ``--spy`` it samples
the daemon with py-spy while streamed launches run and prints the heaviest
frames.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import glob
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from accy import Client
from accy._table import markdown
from accy.protocol.launch.v1 import launch_pb2 as pb
from accy.protocol.launch.v1 import launch_pb2_grpc
from accy.testing import running_daemon

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_service

TICK = os.sysconf("SC_CLK_TCK")


def _tree(pid: int) -> list[int]:
    pids = [pid]
    for path in glob.glob(f"/proc/{pid}/task/*/children"):
        for child in Path(path).read_text().split():
            pids += _tree(int(child))
    return pids


def _cpu_seconds(pid: int) -> float:
    total = 0.0
    for each in _tree(pid):
        with contextlib.suppress(OSError):  # a thread or process that just ended
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / TICK
    return total


def per_call(pid: int, call: Callable[[], object], count: int) -> tuple[float, float]:
    for _ in range(max(50, count // 20)):
        call()
    cpu = _cpu_seconds(pid)
    samples = []
    for _ in range(count):
        t = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t)
    samples.sort()
    return (_cpu_seconds(pid) - cpu) / count * 1e6, samples[len(samples) // 2] * 1e6


def summarize(raw: Path, top: int = 25) -> str:
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        total += count
        frames = stack.split(";")
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    lines = [f"{total} samples; heaviest own frames:"]
    lines += [f"{c / total * 100:5.1f}% {f[:150]}" for f, c in own.most_common(top)]
    lines.append("accyd frames, inclusive:")
    lines += [
        f"{c / total * 100:5.1f}% {f[:150]}"
        for f, c in inclusive.most_common()
        if "accyd/" in f and c / total > 0.005
    ][:top]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["auto", "cuda", "host"], default="auto")
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--spy", help="path of a py-spy binary to profile the daemon with")
    parser.add_argument("--native", action="store_true", help="py-spy samples C frames too")
    parser.add_argument("--spy-out", default=os.path.join(tempfile.gettempdir(), "accyd.spy"))
    args = parser.parse_args()
    echo_target = f"unix:{tempfile.mkdtemp(prefix='accy-echo-')}/echo.sock"
    echo = bench_service.EchoServer([echo_target])
    rows = []
    try:
        with (
            running_daemon(backend=args.backend, tcp=False) as daemon,
            Client(daemon.unix_target) as client,
        ):
            pid = daemon.process.pid
            session = client.load("accy.kernel.device_scan")
            session.allocate_intermediates(n=args.n)
            x = client.buffer(np.random.default_rng(0).random(args.n, dtype=np.float32))
            y = client.empty(args.n, "f32")
            channel = grpc.insecure_channel(daemon.unix_target)
            stub = launch_pb2_grpc.LaunchServiceStub(channel)
            health = health_pb2_grpc.HealthStub(channel)
            metadata = (("accy-client-id", client.client_id),)
            launch = pb.LaunchRequest(session_id=session.id, operands=[x.id], results=[y.id])
            launch.runtime_scalars["n"].u32 = args.n
            waited = pb.LaunchRequest()
            waited.CopyFrom(launch)
            waited.wait = True
            with bench_service._channel(echo_target) as echo_channel:
                unary = bench_service._unary(echo_channel)
                streamed = bench_service._StreamEcho(echo_channel)
                payload = bytes(waited.ByteSize())
                cases: list[tuple[str, int, Callable[[], object]]] = [
                    ("raw gRPC echo (its own process)", echo.process.pid, lambda: unary(payload)),
                    ("streaming echo (ping-pong)", echo.process.pid, lambda: streamed(payload)),
                    ("Health.Check", pid, lambda: health.Check(health_pb2.HealthCheckRequest())),
                    (
                        "GetStatus",
                        pid,
                        lambda: stub.GetStatus(pb.GetStatusRequest(), metadata=metadata),
                    ),
                    ("Launch, no wait", pid, lambda: stub.Launch(launch, metadata=metadata)),
                    ("Launch, wait", pid, lambda: stub.Launch(waited, metadata=metadata)),
                    (
                        "Session.launch, wait (ring)",
                        pid,
                        lambda: session.launch([x], [y], n=args.n),
                    ),
                ]
                for name, process, call in cases:
                    cpu, wall = per_call(process, call, args.count)
                    rows.append([name, f"{cpu:.0f} µs", f"{wall:.0f} µs"])
                streamed.close()
            if args.spy:
                server = _tree(pid)[-1]
                spy = subprocess.Popen(
                    [args.spy, "record", "-p", str(server), "-d", "8", "-r", "400", "-f", "raw",
                     "-o", args.spy_out, "--nonblocking", "--threads",
                     *(["--native"] if args.native else [])],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
                deadline = time.monotonic() + 9
                while time.monotonic() < deadline:
                    session.launch([x], [y], n=args.n)
                spy.wait(30)
                print(summarize(Path(args.spy_out)))
            stub.WaitLaunch(pb.WaitLaunchRequest(session_id=session.id), metadata=metadata)
    finally:
        echo.close()
    print()
    print(markdown(["call (raw stub)", "daemon CPU per call", "wall p50"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
