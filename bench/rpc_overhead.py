"""Where a unary call's fixed cost goes: raw gRPC against the daemon, raw and through the client.

Starts ``accyd serve`` (``--backend host`` by default) on a Unix socket and a minimal grpc.aio echo
server (generic handler, bytes in and out) in a process of its own, then times,
over one sync channel each, median µs of ``--repeat`` calls after ``--warmup``:

- (a) ``raw echo``: a unary echo of 8 bytes against the minimal server (the floor);
- (b) ``raw Ping``: the daemon's ``Ping`` on a plain ``grpc.insecure_channel`` with
  the client id metadata (and ``raw Ping +timeout``: the same with a deadline);
- (c) ``client Ping``: ``client._conn.call(Ping)`` through the accy client library;
- (d) ``client GetStatus``: the same for ``GetStatus``;
- (e) ``CopySegment 4 KiB``: the copy call alone, from a 4 KiB shared array to a buffer
  (``SharedPool.copy``, as ``Buffer.write`` makes it for a large array);
- (f) ``shared write 4 KiB``: ``Buffer.write`` of that shared array, which below
  ``SHM_THRESHOLD`` (256 KiB) streams the bytes over ``WriteBuffer`` instead.

Cases are interleaved in ``--rounds`` so drift on a loaded machine falls on all of
them alike. Beside the latency it reports the CPU time each call costs the serving
process (all its threads, from ``/proc/PID/task/*/schedstat``) and this one
(``time.process_time``): on a loaded machine those move far less than latency.
``--baseline DIR`` (a tree with ``client/`` and ``server/``, e.g. from ``git archive``)
runs the whole measurement alternately with that code and with this tree's, each in a
child process, and prints both columns. Prints a table last.

    python bench/rpc_overhead.py [--repeat N] [--rounds R] [--baseline DIR]
        [--backend host|cuda] [--device-workers on|off] [--daemon-args "--loop-spin-us 0"]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ECHO_METHOD = "/bench.Echo/Echo"
CASES = (
    "raw echo",
    "raw Ping",
    "raw Ping +timeout",
    "client Ping",
    "client GetStatus",
    "CopySegment 4 KiB",
    "shared write 4 KiB",
)


def _serve_echo(path: str, ready: Any) -> None:
    """A grpc.aio server of one bytes-in, bytes-out unary method, until killed."""
    import grpc

    async def echo(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return request

    async def serve() -> None:
        server = grpc.aio.server()
        handler = grpc.method_handlers_generic_handler(
            "bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
        )
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"unix:{path}")
        await server.start()
        ready.set()
        await server.wait_for_termination()

    asyncio.run(serve())


def cpu_ns(pid: int) -> int:
    """CPU time (ns) that process ``pid``'s threads have run, those alive now."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):  # the thread ended meanwhile
            continue
    return total


def served_by(supervisor: int) -> int:
    """The server process a supervised ``accyd serve`` started (its only child)."""
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    return int(children[0]) if children else supervisor


class Case:
    """One case's latencies and the CPU its calls cost the server and this process."""

    def __init__(self, run: Callable[[], object], server: int) -> None:
        self.run, self.server = run, server
        self.latency: list[float] = []
        self.calls = 0
        self.server_ns = self.client_ns = 0

    def sample(self, count: int, *, timed: bool = True) -> None:
        clock, run = time.perf_counter_ns, self.run
        server_began, client_began = cpu_ns(self.server), time.process_time_ns()
        for _ in range(count):
            began = clock()
            run()
            self.latency.append((clock() - began) / 1e3)
        if not timed:
            self.latency.clear()
            return
        self.client_ns += time.process_time_ns() - client_began
        self.server_ns += cpu_ns(self.server) - server_began
        self.calls += count

    def result(self) -> dict[str, float]:
        return {
            "latency": statistics.median(self.latency),
            "server cpu": self.server_ns / self.calls / 1e3,
            "client cpu": self.client_ns / self.calls / 1e3,
        }


def measure(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Each case's median latency and CPU per call (µs), with the code this process imports."""
    import grpc
    import numpy as np

    from accy import Client, _link_transport
    from accy._seam import CopyRequest
    from accy.protocol import CLIENT_ID_METADATA
    from accy.protocol.launch.v1 import launch_pb2 as pb
    from accy.testing import running_daemon

    folder = tempfile.mkdtemp(prefix="rpc-overhead-")
    echo_path = os.path.join(folder, "echo.sock")
    spawn = multiprocessing.get_context("spawn")
    ready = spawn.Event()
    echo_server = spawn.Process(target=_serve_echo, args=(echo_path, ready), daemon=True)
    echo_server.start()
    try:
        if not ready.wait(30):
            raise RuntimeError("the echo server did not start")
        env = {"ACCYD_DEVICE_WORKERS": "1" if args.device_workers == "on" else "0"}
        extra = shlex.split(args.daemon_args)
        with running_daemon(backend=args.backend, tcp=False, env=env, extra=extra) as daemon:
            echo_channel = grpc.insecure_channel(f"unix:{echo_path}")
            echo: grpc.UnaryUnaryMultiCallable[bytes, bytes] = echo_channel.unary_unary(ECHO_METHOD)
            raw_channel = grpc.insecure_channel(daemon.unix_target)
            path = "/accy.launch.v1.LaunchService/"
            attach = raw_channel.unary_stream(
                path + "Attach", pb.AttachRequest.SerializeToString, pb.AttachEvent.FromString
            )
            ping = raw_channel.unary_unary(
                path + "Ping", pb.PingRequest.SerializeToString, pb.PingResponse.FromString
            )
            stream = attach(pb.AttachRequest(client_name="rpc-overhead"))
            metadata = ((CLIENT_ID_METADATA, next(stream).attached.client_id),)
            payload = b"12345678"
            status = pb.GetStatusRequest()
            with Client(daemon.unix_target) as client:
                conn = client._conn
                buffer = client.empty(1024, np.float32)
                shared = client.shared_array(1024, np.float32)
                link = conn.current_link()
                pool = _link_transport.shared_pool(link.transport)
                placed = None if pool is None else pool.locate(shared)
                if pool is None or placed is None:
                    raise RuntimeError("the shared array is not in a segment of this link")
                segment, at = placed
                copy = CopyRequest(segment.id, at, buffer.id, 0, 4096, True, conn.timeout)

                def copy_segment() -> object:
                    return link.transport.copy(copy)

                echo_pid, daemon_pid = echo_server.pid or 0, served_by(daemon.process.pid)
                cases = {
                    "raw echo": Case(lambda: echo(payload), echo_pid),
                    "raw Ping": Case(lambda: ping(pb.PingRequest(), metadata=metadata), daemon_pid),
                    "raw Ping +timeout": Case(
                        lambda: ping(pb.PingRequest(), metadata=metadata, timeout=30.0), daemon_pid
                    ),
                    "client Ping": Case(
                        lambda: conn.call(conn.stub.Ping, pb.PingRequest()), daemon_pid
                    ),
                    "client GetStatus": Case(
                        lambda: conn.call(conn.stub.GetStatus, status), daemon_pid
                    ),
                    "CopySegment 4 KiB": Case(copy_segment, daemon_pid),
                    "shared write 4 KiB": Case(lambda: buffer.write(shared), daemon_pid),
                }
                for case in cases.values():
                    case.sample(args.warmup, timed=False)
                per_round = max(1, args.repeat // args.rounds)
                for _ in range(args.rounds):
                    for case in cases.values():
                        case.sample(per_round)
                buffer.free()
            stream.cancel()
            raw_channel.close()
            echo_channel.close()
    finally:
        echo_server.kill()
        echo_server.join()
    return {name: case.result() for name, case in cases.items()}


Results = dict[str, dict[str, float]]


def _child(tree: Path | None, args: argparse.Namespace) -> Results:
    """``measure`` in a child process, importing ``tree``'s code (this tree's if ``None``)."""
    env = dict(os.environ)
    if tree is not None:
        paths = [str(tree / "client"), str(tree / "server")]
        env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    command = [
        sys.executable, __file__, "--json", "--repeat", str(args.repeat),
        "--warmup", str(args.warmup), "--rounds", str(args.rounds), "--backend", args.backend,
        "--device-workers", args.device_workers, "--daemon-args", args.daemon_args,
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    result: Results = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _table(columns: dict[str, Results], args: argparse.Namespace) -> None:
    names = list(columns)
    print(
        f"rpc_overhead ({args.backend} backend, device workers {args.device_workers}"
        f"{', ' + args.daemon_args if args.daemon_args else ''}), Unix socket: median "
        "latency µs (ratio to raw echo), CPU µs per call of the server / of this client"
    )
    print(f"  {'case':20}" + "".join(f"{name:>36}" for name in names))
    for case in CASES:
        cells = []
        for name in names:
            row, echo = columns[name][case], columns[name]["raw echo"]["latency"]
            cells.append(
                f"{row['latency']:7.1f} ({row['latency'] / echo:4.2f}x)"
                f" {row['server cpu']:6.1f} / {row['client cpu']:5.1f}"
            )
        print(f"  {case:20}" + "".join(f"{cell:>36}" for cell in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3000, help="calls timed per case")
    parser.add_argument("--warmup", type=int, default=200, help="calls per case not timed")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds")
    parser.add_argument("--backend", choices=["host", "cuda"], default="host")
    parser.add_argument("--device-workers", choices=["on", "off"], default="off")
    parser.add_argument("--daemon-args", default="", help="more accyd serve flags, one string")
    parser.add_argument("--baseline", type=Path, help="a tree to compare against (A/B)")
    parser.add_argument("--ab-runs", type=int, default=3, help="child runs a side (A/B)")
    parser.add_argument("--json", action="store_true", help="one JSON line (A/B child)")
    args = parser.parse_args()
    if args.json:
        print(json.dumps(measure(args)))
        return
    if args.baseline is None:
        _table({"this tree": measure(args)}, args)
        return
    runs: dict[str, list[Results]] = {"baseline": [], "this tree": []}
    for _ in range(args.ab_runs):  # alternately, so drift falls on both sides
        runs["baseline"].append(_child(args.baseline, args))
        runs["this tree"].append(_child(None, args))
    columns = {
        side: {
            case: {
                metric: statistics.median(run[case][metric] for run in results)
                for metric in results[0][case]
            }
            for case in CASES
        }
        for side, results in runs.items()
    }
    _table(columns, args)


if __name__ == "__main__":
    main()
