"""The KServe HTTP door's infer latency against a raw aiohttp echo of the same bytes, and the
gRPC door's ModelInfer beside it.

Starts ``accyd serve`` (``--backend host`` by default) with ``--kserve-http-listen`` on the
loopback, and an aiohttp server of one route that answers every POST with the bytes of the
door's own answer to the same request (the floor: the same server library, the same bytes
in and out, no inference). Times each case over one kept-alive connection, median µs of
``--repeat`` calls in ``--rounds`` interleaved rounds:

- ``raw http echo``: POST the request's bytes, read the answer's bytes, from the echo;
- ``http infer binary``: the door, tensors in the binary extension both ways (as
  tritonclient.http and perf_analyzer send them);
- ``http infer json``: the door, tensors as JSON both ways;
- ``grpc infer``: ModelInfer on the gRPC door over TCP (the same loopback).

For ``--model simple`` (16 int32 each way) and ``accy.kernel.device_scan`` at ``--n``.
Prints a table last, with each case's ratio to the echo.

    python bench/kserve_http_latency.py [--backend host|cuda] [--model simple] [--n 1024]
        [--repeat 2000] [--rounds 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from kserve_latency import request_of

HEADER = "Inference-Header-Content-Length"


def bodies(model: str, n: int) -> dict[str, tuple[bytes, dict[str, str]]]:
    """The infer request of each form: its body and headers."""
    if model == "simple":
        tensors = [("INPUT0", [1, 16], "INT32", np.ones(16, np.int32)),
                   ("INPUT1", [1, 16], "INT32", np.ones(16, np.int32))]  # fmt: skip
    else:
        tensors = [("x", [n], "FP32", np.ones(n, np.float32))]
    as_json = {
        "inputs": [
            {"name": name, "shape": shape, "datatype": kind, "data": data.tolist()}
            for name, shape, kind, data in tensors
        ]
    }
    binary = {
        "inputs": [
            {"name": name, "shape": shape, "datatype": kind,
             "parameters": {"binary_data_size": data.nbytes}}
            for name, shape, kind, data in tensors
        ],
        "parameters": {"binary_data_output": True},
    }  # fmt: skip
    header = json.dumps(binary).encode()
    return {
        "json": (json.dumps(as_json).encode(), {"Content-Type": "application/json"}),
        "binary": (
            header + b"".join(data.tobytes() for *_, data in tensors),
            {HEADER: str(len(header)), "Content-Type": "application/octet-stream"},
        ),
    }


def _serve_echo(port: int, answer: bytes, headers: dict[str, str], ready: Any) -> None:
    """An aiohttp server answering every POST with ``answer`` (after reading the body)."""
    from aiohttp import web

    async def echo(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=answer, headers=headers)

    app = web.Application(client_max_size=1 << 30)
    app.router.add_post("/{tail:.*}", echo)
    ready.set()
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def post(connection: http.client.HTTPConnection, path: str, body: bytes, headers: Any) -> bytes:
    connection.request("POST", path, body, headers)
    answer = connection.getresponse()
    data = answer.read()
    if answer.status != 200:
        raise SystemExit(f"{path}: {answer.status} {data[:300]!r}")
    return data


def measure(args: argparse.Namespace) -> dict[str, float]:
    import grpc

    from accy.testing import free_port, running_daemon
    from accyd.doors.kserve.protocol import open_inference_pb2_grpc

    port = free_port()
    extra = ["--no-supervise", "--kserve-http-listen", f"127.0.0.1:{port}",
             *args.daemon_args.split()]  # fmt: skip
    path = f"/v2/models/{args.model}/infer"
    forms = bodies(args.model, args.n)
    with running_daemon(backend=args.backend, extra=extra) as daemon:
        door = http.client.HTTPConnection("127.0.0.1", port)
        body, headers = forms["binary"]
        door.request("POST", path, body, headers)
        first = door.getresponse()
        answer, answer_headers = first.read(), {HEADER: first.headers[HEADER]}
        echo_port = free_port()
        context = multiprocessing.get_context("spawn")
        ready = context.Event()
        echo = context.Process(
            target=_serve_echo, args=(echo_port, answer, answer_headers, ready), daemon=True
        )
        echo.start()
        ready.wait(30)
        time.sleep(0.5)  # run_app binds after the event
        raw = http.client.HTTPConnection("127.0.0.1", echo_port)
        assert daemon.tcp_target is not None
        channel = grpc.insecure_channel(daemon.tcp_target)
        stub = open_inference_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = request_of(args.model, args.n)
        cases: dict[str, Callable[[], object]] = {
            "raw http echo": lambda: post(raw, path, *forms["binary"]),
            "http infer binary": lambda: post(door, path, *forms["binary"]),
            "http infer json": lambda: post(door, path, *forms["json"]),
            "grpc infer": lambda: stub.ModelInfer(request),
        }
        samples: dict[str, list[float]] = {name: [] for name in cases}
        for run in cases.values():
            for _ in range(200):
                run()
        for _ in range(args.rounds):
            for name, run in cases.items():
                for _ in range(args.repeat // args.rounds):
                    began = time.perf_counter_ns()
                    run()
                    samples[name].append((time.perf_counter_ns() - began) / 1e3)
        door.close()
        raw.close()
        channel.close()
        echo.kill()
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="host")
    parser.add_argument("--model", default="simple")
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--daemon-args", default="", help="more flags for accyd serve")
    parser.add_argument("--json")
    args = parser.parse_args()
    found = measure(args)
    echo = found["raw http echo"]
    print(
        f"\nKServe HTTP infer latency, {args.model}"
        + (f" n={args.n}" if args.model != "simple" else "")
    )
    print(f"{'case':<20} {'p50 us':>9} {'x echo':>7}")
    for name, value in found.items():
        print(f"{name:<20} {value:>9.1f} {value / echo:>7.2f}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"model": args.model, "n": args.n, **found}, indent=2)
        )


if __name__ == "__main__":
    main()
