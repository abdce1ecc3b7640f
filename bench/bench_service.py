"""The launch service against a raw gRPC echo of the same transport, measured in one run.

Run from the repository root (the daemon is started here, on a temporary Unix
socket and a TCP loopback port, with the backend asked for):

    python bench/bench_service.py [--backend auto|cuda|host] [--quick] [--json [PATH]]

(a) round trip of a launch (accy.kernel.device_scan, n = 5000, waiting for
    completion, scratch allocated once) against a unary echo of a payload of the
    same size as the LaunchRequest, p50 and p99, for TCP and the Unix socket.
    The launch goes through the client library (``Session.launch``: the shared
    ring on the Unix socket, the ring over a RingStream call on TCP); the unary
    ``Launch`` RPC (raw stub) and a streaming echo (bidi ping-pong, the floor of
    the streaming path) are measured too;
(b) waited launches per second from 1, 4 and 16 client processes (one session
    each, Unix socket), next to unary and streaming echoes per second from as
    many processes;
(c) bytes per second of a buffer write and read (64 MiB in 1 MiB chunks) against
    the echo server streaming the same bytes in the same chunks, each way.

The echo server is ``grpc.aio`` in its own process, like the daemon, so both
sides pay the same Python and transport costs; it answers with raw bytes (no
protobuf), so it is the floor a Python gRPC service can reach. A markdown table
is printed last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import queue
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from accy import Client
from accy._table import markdown
from accy.protocol.launch.v1 import launch_pb2 as pb
from accy.protocol.launch.v1 import launch_pb2_grpc
from accy.testing import free_port, running_daemon

SCAN = "accy.kernel.device_scan"
ECHO = "/accy.bench.Echo/"
MiB = 1 << 20


# -- the echo server (runs as `bench_service.py --serve-echo ADDR...`) -------------------


async def _echo_unary(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    return request


async def _echo_bidi(
    requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
) -> AsyncIterator[bytes]:
    async for request in requests:
        yield request


async def _echo_upload(
    requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
) -> bytes:
    total = 0
    async for chunk in requests:
        total += len(chunk)
    return total.to_bytes(8, "little")


async def _echo_download(
    request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
) -> AsyncIterator[bytes]:
    total, chunk = int.from_bytes(request[:8], "little"), int.from_bytes(request[8:16], "little")
    payload = bytes(chunk)
    for start in range(0, total, chunk):
        yield payload[: min(chunk, total - start)]


async def _serve_echo(addresses: list[str]) -> None:
    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    )
    handler = grpc.method_handlers_generic_handler(
        "accy.bench.Echo",
        {
            "Unary": grpc.unary_unary_rpc_method_handler(_echo_unary),
            "Bidi": grpc.stream_stream_rpc_method_handler(_echo_bidi),
            "Upload": grpc.stream_unary_rpc_method_handler(_echo_upload),
            "Download": grpc.unary_stream_rpc_method_handler(_echo_download),
        },
    )
    server.add_generic_rpc_handlers((handler,))
    for address in addresses:
        server.add_insecure_port(address)
    await server.start()
    await server.wait_for_termination()


class EchoServer:
    """The echo server in a child process, listening on the given addresses."""

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = addresses
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve-echo", *addresses],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        for address in addresses:
            while True:
                try:
                    with grpc.insecure_channel(address) as channel:
                        _unary(channel)(b"x", timeout=1)
                    break
                except grpc.RpcError:
                    if time.monotonic() > deadline or self.process.poll() is not None:
                        raise RuntimeError(f"the echo server did not answer on {address}") from None
                    time.sleep(0.05)

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def _channel(target: str) -> grpc.Channel:
    options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    return grpc.insecure_channel(target, options)


def _unary(channel: grpc.Channel) -> grpc.UnaryUnaryMultiCallable[bytes, bytes]:
    return channel.unary_unary(ECHO + "Unary")


class _StreamEcho:
    """Ping-pong on one bidi echo call: a message out, its echo back (the streaming floor)."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        bidi: grpc.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(ECHO + "Bidi")
        self._answers = bidi(self._requests())

    def _requests(self) -> Iterator[bytes]:
        while (payload := self._outbox.get()) is not None:
            yield payload

    def __call__(self, payload: bytes) -> bytes:
        self._outbox.put(payload)
        return next(self._answers)

    def close(self) -> None:
        self._outbox.put(None)
        self._answers.cancel()


# -- measurements ----------------------------------------------------------------------


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_us": statistics.median(ordered) * 1e6,
        "p99_us": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e6,
        "count": len(ordered),
    }


def _timed(call: Callable[[], object], iterations: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(iterations):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return samples


class _LaunchRig:
    """One client with a loaded scan session, scratch and buffers for ``n`` elements."""

    def __init__(self, target: str, n: int) -> None:
        self.n = n
        self.client = Client(target, client_name="bench")
        self.session = self.client.load(SCAN)
        self.session.allocate_intermediates(n=n)
        self.x = self.client.buffer(np.random.default_rng(0).random(n, dtype=np.float32))
        self.y = self.client.empty(n, "f32")
        self.request_size = pb.LaunchRequest(
            session_id=self.session.id,
            operands=[self.x.id],
            results=[self.y.id],
            runtime_scalars={"n": pb.Scalar(u32=n)},
            wait=True,
        ).ByteSize()

        self.unary_request = pb.LaunchRequest(
            session_id=self.session.id,
            operands=[self.x.id],
            results=[self.y.id],
            runtime_scalars={"n": pb.Scalar(u32=n)},
            wait=True,
        )
        self.stub = launch_pb2_grpc.LaunchServiceStub(self.client._conn.channel)
        self.metadata = (("accy-client-id", self.client.client_id),)

    def launch(self) -> None:
        """Through the client library (its ring, or its ring over a stream on TCP)."""
        self.session.launch([self.x], [self.y], n=self.n)

    def launch_unary(self) -> None:
        """The unary Launch RPC on a raw stub (no client-library cost)."""
        self.stub.Launch(self.unary_request, metadata=self.metadata)

    def close(self) -> None:
        self.client.close()


def round_trip(target: str, echo_target: str, n: int, iterations: int) -> dict[str, Any]:
    """Launch p50/p99 against unary and streaming echo p50/p99 on one transport.

    The four series are interleaved in blocks, so drift hits them alike.
    """
    rig = _LaunchRig(target, n)
    with _channel(echo_target) as channel:
        echo, stream_echo = _unary(channel), _StreamEcho(channel)
        payload = bytes(rig.request_size)
        series: dict[str, Callable[[], object]] = {
            "echo": lambda: echo(payload),
            "stream_echo": lambda: stream_echo(payload),
            "launch": rig.launch,
            "unary_launch": rig.launch_unary,
        }
        samples: dict[str, list[float]] = {name: [] for name in series}
        block = max(10, iterations // 10)
        for _ in range(0, iterations, block):
            for name, call in series.items():
                samples[name] += _timed(call, block, warmup=5)
        stream_echo.close()
    rig.close()
    found = {name: _percentiles(values) for name, values in samples.items()}
    echo_p50 = found["echo"]["p50_us"]
    return found | {
        "request_bytes": rig.request_size,
        "overhead_p50_percent": (found["launch"]["p50_us"] / echo_p50 - 1) * 100,
        "unary_overhead_p50_percent": (found["unary_launch"]["p50_us"] / echo_p50 - 1) * 100,
        "stream_overhead_p50_percent": (
            found["launch"]["p50_us"] / found["stream_echo"]["p50_us"] - 1
        )
        * 100,
    }


def _rate_worker(kind: str, target: str, n: int, start_at: float, seconds: float) -> int:
    """In a child process: calls completed between ``start_at`` and ``start_at + seconds``."""
    if kind == "launch":
        rig = _LaunchRig(target, n)
        call: Callable[[], object] = rig.launch
    elif kind == "stream_echo":
        streamed, payload = _StreamEcho(_channel(target)), bytes(64)

        def call() -> object:
            return streamed(payload)
    else:
        channel = _channel(target)
        echo = _unary(channel)
        payload = bytes(64)

        def call() -> object:
            return echo(payload)

    call()
    time.sleep(max(0.0, start_at - time.time()))
    count = 0
    end = start_at + seconds
    while time.time() < end:
        call()
        count += 1
    return count


def rates(
    target: str, echo_target: str, n: int, processes: list[int], seconds: float
) -> list[dict[str, Any]]:
    """Launches/s and echoes/s summed over P processes measuring the same window."""
    context = multiprocessing.get_context("spawn")
    rows = []
    for count in processes:
        row: dict[str, Any] = {"processes": count}
        kinds = (("launch", target), ("echo", echo_target), ("stream_echo", echo_target))
        for kind, address in kinds:
            start_at = time.time() + 2.0 + 0.15 * count  # time for every child to start
            with context.Pool(count) as pool:
                done = pool.starmap(_rate_worker, [(kind, address, n, start_at, seconds)] * count)
            row[f"{kind}_per_second"] = sum(done) / seconds
        rows.append(row)
    return rows


def _chunks(total: int, chunk: int) -> Iterator[bytes]:
    payload = bytes(chunk)
    for start in range(0, total, chunk):
        yield payload[: min(chunk, total - start)]


def throughput(target: str, echo_target: str, nbytes: int, repeats: int) -> dict[str, Any]:
    """Bytes/s of buffer write and read against streaming echo of the same bytes (best of N)."""
    data = np.random.default_rng(1).integers(0, 255, nbytes, dtype=np.uint8)
    results: dict[str, list[float]] = {k: [] for k in ("write", "read", "echo_up", "echo_down")}
    with Client(target, client_name="bench") as client, _channel(echo_target) as channel:
        buffer = client.empty(nbytes, "u8")
        upload: grpc.StreamUnaryMultiCallable[bytes, bytes] = channel.stream_unary(ECHO + "Upload")
        download: grpc.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(
            ECHO + "Download"
        )
        request = nbytes.to_bytes(8, "little") + MiB.to_bytes(8, "little")
        buffer.write(data)  # warm both paths once, untimed
        upload(_chunks(nbytes, MiB))
        for _ in range(repeats):
            started = time.perf_counter()
            buffer.write(data)
            results["write"].append(time.perf_counter() - started)
            started = time.perf_counter()
            back = buffer.read()
            results["read"].append(time.perf_counter() - started)
            started = time.perf_counter()
            upload(_chunks(nbytes, MiB))
            results["echo_up"].append(time.perf_counter() - started)
            started = time.perf_counter()
            received = sum(len(c) for c in download(request))
            results["echo_down"].append(time.perf_counter() - started)
            assert received == nbytes and np.array_equal(back, data)
    return {"bytes": nbytes} | {
        f"{k}_bytes_per_second": nbytes / min(v) for k, v in results.items()
    }


# -- report ----------------------------------------------------------------------------


def _us(found: dict[str, float]) -> str:
    return f"{found['p50_us']:.0f} / {found['p99_us']:.0f} µs"


def _table(report: dict[str, Any]) -> str:
    rows: list[list[str]] = []
    for transport, r in report["round_trip"].items():
        what = f"{transport} (n={report['n']}, wait), p50 / p99"
        rows += [
            [
                f"launch round trip (client library, ring), {what}",
                _us(r["launch"]),
                _us(r["echo"]),
                f"{r['overhead_p50_percent']:+.0f}% at p50",
            ],
            [
                f"unary Launch RPC round trip (raw stub), {what}",
                _us(r["unary_launch"]),
                _us(r["echo"]),
                f"{r['unary_overhead_p50_percent']:+.0f}% at p50",
            ],
            [
                f"launch (client library, ring) vs streaming echo, {transport}",
                _us(r["launch"]),
                f"{_us(r['stream_echo'])} (streaming)",
                f"{r['stream_overhead_p50_percent']:+.0f}% at p50",
            ],
        ]
    for row in report["rates"]:
        rows.append(
            [
                f"waited launches/s from {row['processes']} client processes (unix)",
                f"{row['launch_per_second']:,.0f}",
                f"{row['echo_per_second']:,.0f} unary; {row['stream_echo_per_second']:,.0f} "
                "streaming",
                f"{row['launch_per_second'] / row['echo_per_second']:.2f}x; "
                f"{row['launch_per_second'] / row['stream_echo_per_second']:.2f}x",
            ]
        )
    for transport, t in report["throughput"].items():
        size = t["bytes"] / MiB
        for ours, theirs, what in (("write", "echo_up", "write"), ("read", "echo_down", "read")):
            a, b = t[f"{ours}_bytes_per_second"], t[f"{theirs}_bytes_per_second"]
            rows.append(
                [
                    f"buffer {what} {size:.0f} MiB, {transport}",
                    f"{a / 1e9:.3f} GB/s",
                    f"{b / 1e9:.3f} GB/s",
                    f"{a / b:.2f}x",
                ]
            )
    return markdown(["measure", "accyd", "raw gRPC echo", "accyd vs echo"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["auto", "cuda", "host"], default="auto")
    parser.add_argument("--quick", action="store_true", help="fewer samples, smaller transfers")
    parser.add_argument("--json", nargs="?", const="-", metavar="PATH", help="JSON to PATH or -")
    parser.add_argument("--n", type=int, default=5000, help="scan size of the round trip")
    parser.add_argument("--serve-echo", nargs="+", metavar="ADDR", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_echo:
        asyncio.run(_serve_echo(args.serve_echo))
        return 0

    iterations = 300 if args.quick else 3000
    seconds = 1.0 if args.quick else 5.0
    nbytes = (16 if args.quick else 64) * MiB
    repeats = 2 if args.quick else 5
    processes = [1, 4, 16]

    folder = Path(tempfile.mkdtemp(prefix="accy-bench-"))
    echo_unix, echo_tcp = f"unix:{folder}/echo.sock", f"127.0.0.1:{free_port()}"
    echo = EchoServer([echo_unix, echo_tcp])
    try:
        with running_daemon(backend=args.backend) as daemon:
            assert daemon.tcp_target is not None
            with Client(daemon.unix_target) as probe:
                backend, device = probe.attachment.backend, probe.attachment.device_name
            transports = {
                "unix": (daemon.unix_target, echo_unix),
                "tcp": (daemon.tcp_target, echo_tcp),
            }
            print(f"accyd backend {backend} ({device}); measuring...", file=sys.stderr)
            report: dict[str, Any] = {
                "backend": backend,
                "device": device,
                "n": args.n,
                "quick": args.quick,
                "host": platform.node(),
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "grpc": grpc.__version__,
                "round_trip": {
                    name: round_trip(t, e, args.n, iterations)
                    for name, (t, e) in transports.items()
                },
                "rates": rates(daemon.unix_target, echo_unix, args.n, processes, seconds),
                "throughput": {
                    name: throughput(t, e, nbytes, repeats) for name, (t, e) in transports.items()
                },
            }
    finally:
        echo.close()
    if args.json == "-":
        print(json.dumps(report, indent=2))
    elif args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"\naccyd {report['backend']} backend on {report['device']}, {report['cpus']} CPUs, "
        f"Python {report['python']}, grpcio {report['grpc']}"
        + (" (quick)" if args.quick else "")
        + "\n"
    )
    print(_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
