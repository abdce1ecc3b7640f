"""ModelInfer's latency against a raw gRPC echo of the same size and against accy's own client.

Starts ``accyd serve`` (``--backend host`` by default) on a Unix socket and a minimal
grpc.aio echo server (``rpc_overhead._serve_echo``), then times over one channel each,
median µs of ``--repeat`` calls in ``--rounds`` interleaved rounds:

- ``raw echo``: a unary echo whose request and answer are the bytes of a ModelInfer
  request of the same model (the floor for one call of that size);
- ``kserve infer``: ``ModelInfer`` on the daemon, a raw stub of the generated code;
- ``tritonclient infer``: the same through tritonclient (``--tritonclient PYTHON``, the
  Python of its own environment; it runs in a child process and reports its median);
- ``accy run``: ``Client.run`` (one call: inputs in, results out, as ModelInfer);
- ``accy launch``: a waited ``Session.launch`` on buffers written once (no data moved).

For ``--model simple`` (16 int32 each way) and ``accy.kernel.device_scan`` at ``--n``.
Prints a table last, with each case's ratio to the echo (the goal: ModelInfer <= 1.5x).

    python bench/kserve_latency.py [--backend host|cuda] [--model simple] [--n 1024]
        [--repeat 2000] [--rounds 5] [--tritonclient PATH] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from rpc_overhead import ECHO_METHOD, _serve_echo

_TRITON = """
import statistics, sys, time
import numpy as np
import tritonclient.grpc as grpcclient
url, model, n, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
client = grpcclient.InferenceServerClient(url=url)
if model == "simple":
    inputs = [grpcclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
else:
    inputs = [grpcclient.InferInput("x", [n], "FP32")]
    inputs[0].set_data_from_numpy(np.ones(n, dtype=np.float32))
for _ in range(200):
    client.infer(model, inputs)
times = []
for _ in range(repeat):
    began = time.perf_counter_ns()
    client.infer(model, inputs)
    times.append((time.perf_counter_ns() - began) / 1e3)
print(statistics.median(times))
"""


def request_of(model: str, n: int) -> Any:
    from accyd.doors.kserve.protocol import open_inference_pb2 as pb

    request = pb.ModelInferRequest(model_name=model)
    if model == "simple":
        for name in ("INPUT0", "INPUT1"):
            request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
            request.raw_input_contents.append(np.ones(16, dtype=np.int32).tobytes())
    else:
        request.inputs.add(name="x", datatype="FP32", shape=[n])
        request.raw_input_contents.append(np.ones(n, dtype=np.float32).tobytes())
    return request


def measure(args: argparse.Namespace, folder: Path) -> dict[str, float]:
    import grpc

    from accy import Client
    from accy.testing import running_daemon
    from accyd.doors.kserve.protocol import open_inference_pb2_grpc

    echo_path = str(folder / "echo.sock")
    ready = multiprocessing.get_context("spawn").Event()
    echo = multiprocessing.get_context("spawn").Process(
        target=_serve_echo, args=(echo_path, ready), daemon=True
    )
    echo.start()
    ready.wait(30)
    request = request_of(args.model, args.n)
    payload = request.SerializeToString()
    extra = ["--no-supervise", *args.daemon_args.split()]
    with running_daemon(backend=args.backend, tcp=False, extra=extra) as daemon:
        channel = grpc.insecure_channel(daemon.unix_target)
        stub = open_inference_pb2_grpc.GRPCInferenceServiceStub(channel)
        echo_channel = grpc.insecure_channel(f"unix:{echo_path}")
        call_echo = echo_channel.unary_unary(ECHO_METHOD)
        client = Client(daemon.unix_target)
        if args.model == "simple":
            operands = [np.ones(16, dtype=np.int32), np.ones(16, dtype=np.int32)]
            results = [client.empty(16, "i32"), client.empty(16, "i32")]
            scalars: dict[str, int] = {}
        else:
            operands = [np.ones(args.n, dtype=np.float32)]
            results = [client.empty(args.n, "f32")]
            scalars = {"n": args.n}
        session = client.load(args.model)
        if args.model != "simple":
            session.allocate_intermediates(**scalars)
        buffers = [client.buffer(a) for a in operands]
        cases: dict[str, Callable[[], object]] = {
            "raw echo": lambda: call_echo(payload),
            "kserve infer": lambda: stub.ModelInfer(request),
            "accy run": lambda: client.run(args.model, *operands),
            "accy launch": lambda: session.launch(operands=buffers, results=results, **scalars),
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
        found = {name: statistics.median(values) for name, values in samples.items()}
        if args.tritonclient:
            done = subprocess.run(
                [args.tritonclient, "-c", _TRITON, daemon.unix_target, args.model, str(args.n),
                 str(args.repeat)],
                capture_output=True, text=True, timeout=600, check=True,
            )  # fmt: skip
            found["tritonclient infer"] = float(done.stdout.strip().splitlines()[-1])
        client.close()
        channel.close()
        echo_channel.close()
    echo.kill()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="host")
    parser.add_argument("--model", default="simple")
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tritonclient", help="the Python of tritonclient's environment")
    parser.add_argument("--daemon-args", default="", help="more flags for accyd serve")
    parser.add_argument("--json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="accy-kserve-bench-") as folder:
        found = measure(args, Path(folder))
    echo = found["raw echo"]
    print(
        f"\nModelInfer latency, {args.model}" + (f" n={args.n}" if args.model != "simple" else "")
    )
    print(f"{'case':<20} {'p50 us':>9} {'x echo':>7}")
    for name, value in found.items():
        print(f"{name:<20} {value:>9.1f} {value / echo:>7.2f}")
    ratio = found["kserve infer"] / echo
    verdict = "met" if ratio <= 1.5 else "not met"
    print(f"goal: kserve infer <= 1.5x raw echo: {verdict} ({ratio:.2f}x)")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"model": args.model, "n": args.n, **found}, indent=2)
        )


if __name__ == "__main__":
    main()
