"""Sharing one GPU through accy against not sharing it: baselines and accy series in one run.

Run from the repository root on a machine with a GPU (about a minute; every
wait has a deadline):

    python bench/bench_sharing.py --out sharing.json            # baselines + accy, CUDA
    python bench/bench_sharing.py --backend host --out s.json   # accy series only, host backend

Every series runs the kernel of bench/catalog/fma.cu (8 blocks x 128 threads,
a chain of ``iters`` dependent FMAs per thread), with ``iters`` calibrated with
CUDA events to a "short" (8 µs) and a "long" (46.5 µs) kernel, and iters = 1
("tiny") for round trips. Baselines (cuda.bindings, pre-packed arguments, each
stream synchronized every 16 launches): one process on one stream (kernels/s
and launch + synchronize p50/p99), one process round-robin on 8 streams, 8
processes each with its own context, and the same 8 under MPS (a control
daemon on private folders, quit after). accy series (``accyd serve --catalog
bench/catalog``, clients in separate processes on the public client API): the
same-host waited round trip, one client's rate with ``wait=False``, 8 clients'
aggregate rate, over TCP loopback one client's rate and its waited round trip
against a raw streaming gRPC echo of the same size, and device_scan at
n = 5000 waited. The ratios against issue 11's goals are the table printed last.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _sharing_kernel import SYNC_EVERY
from _sharing_report import goals_table, ratios, series_table
from _sharing_workers import Run, Spec, run_workers, worker_main

CATALOG = Path(__file__).with_name("catalog")
TARGETS_US = {"short": 8.0, "long": 46.5}
HOST_ITERS = {"tiny": 1, "short": 8, "long": 32}
"""The host backend has no calibration: small fixed chains."""
UNCALIBRATED_ITERS = {"tiny": 1, "short": 3500, "long": 23000}
"""On the GPU when calibration failed: about 8 and 46.5 µs on an H200 (4-cycle FMA chains)."""
SCAN_N = 5000
REMOTE_SYNC_EVERY = 256
"""The remote rate waits on its session every this many launches (the client's launch window):
pipelined, where a wait every 16 launches would cost a network round trip per 16."""
WORKERS: dict[str, tuple[str, str]] = {
    "cuda-inproc": ("_sharing_cuda", "prepare_inproc"),
    "cuda-scan": ("_scan_cuda", "prepare_scan"),
    "cuda-rate": ("_sharing_cuda", "prepare_rate"),
    "accy-rate": ("_sharing_accy", "prepare_rate"),
    "accy-rtt": ("_sharing_accy", "prepare_rtt"),
    "accy-scan": ("_sharing_accy", "prepare_scan"),
    "accy-victim": ("_noisy_clients", "prepare_victim"),
    "accy-aggressor": ("_noisy_clients", "prepare_aggressor"),
    "cuda-victim": ("_noisy_clients", "prepare_cuda_victim"),
    "cuda-aggressor": ("_noisy_clients", "prepare_cuda_aggressor"),
}
"""Kinds of worker processes (``--worker``); bench/contention.py runs the last four too."""


def _prepare(spec: Spec) -> Run:
    module, function = WORKERS[spec["kind"]]
    prepare: Callable[[Spec], Run] = getattr(importlib.import_module(module), function)
    return prepare(spec)


class Plan:
    """Runs the series in order: each one's failure is recorded and the rest go on; a series
    that would start past the time budget is skipped and recorded as such."""

    def __init__(self, budget: float) -> None:
        self.started = time.monotonic()
        self.budget = budget

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f} s] {text}", flush=True)

    def step(self, name: str, body: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        if time.monotonic() - self.started > self.budget:
            self.say(f"{name}: skipped (past the {self.budget:.0f} s budget)")
            return {"error": "skipped: past the time budget"}
        self.say(f"{name}...")
        try:
            found = body()
        except Exception as error:
            self.say(f"{name}: FAILED: {error}")
            return {"error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()}
        self.say(f"{name}: {_brief(found)}")
        return found


def _brief(found: dict[str, Any]) -> str:
    if "per_second" in found:
        return f"{found['per_second']:,.0f} kernels/s"
    if "launch" in found:
        text = f"launch p50 {found['launch']['p50_us']:.1f} µs"
        if "stream_echo" in found:
            text += f", streaming echo p50 {found['stream_echo']['p50_us']:.1f} µs"
        return text
    if "p50_us" in found:
        return f"p50 {found['p50_us']:.1f} µs, p99 {found['p99_us']:.1f} µs"
    return "done"


def _aggregate(results: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "per_second": sum(r["per_second"] for r in results),
        "processes": len(results),
        "per_process": [r["per_second"] for r in results],
    }


def _rate_specs(kind: str, count: int, **fields: Any) -> list[Spec]:
    return [{"kind": kind, "index": i, **fields} for i in range(count)]


# -- the baselines (CUDA only) ------------------------------------------------------------------


def baselines(plan: Plan, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """In-process series and calibration, then 8 processes with own contexts, then under MPS."""
    from _sharing_cuda import MpsUnavailable, mps_log_tail, mps_server

    image = str(folder / "fma.image")
    seconds, timeout = args.seconds, args.seconds * 4 + 60
    spec = {
        "kind": "cuda-inproc",
        "image_path": image,
        "seconds": seconds,
        "iterations": args.iterations,
        "tiny_iters": HOST_ITERS["tiny"],
        "targets_us": TARGETS_US,
    }
    found: dict[str, Any] = {
        "in_process": plan.step(
            "in-process: calibrate, one stream, eight streams",
            lambda: run_workers([spec], run_timeout=timeout + 60)[0],
        )
    }
    if "error" in found["in_process"]:
        raise RuntimeError(f"the in-process baseline failed: {found['in_process']['error']}")
    kernels = found["in_process"]["kernels"]

    def processes(env: dict[str, str] | None, name: str, every: int) -> dict[str, Any]:
        specs = _rate_specs(
            "cuda-rate",
            args.clients,
            image_path=image,
            iters=kernels[name]["iters"],
            seconds=seconds,
            sync_every=every,
        )
        return _aggregate(run_workers(specs, env=env, run_timeout=timeout))

    def each(prefix: str, label: str, env: dict[str, str] | None) -> None:
        for name in TARGETS_US:
            for suffix, every, how in (
                ("", SYNC_EVERY, "a sync every 16"),
                ("_waited", 1, "each launch synchronized"),
            ):
                found[f"{prefix}_{name}{suffix}"] = plan.step(
                    f"{args.clients} processes, {label}, {name} kernel, {how}",
                    functools.partial(processes, env, name, every),
                )

    each("own_contexts", "own contexts", None)
    try:
        with mps_server() as variables:
            each("mps", "under MPS", dict(os.environ) | variables)
            found["mps_log"] = mps_log_tail(variables)
    except MpsUnavailable as error:
        plan.say(f"MPS: not started: {error}")
        for name in TARGETS_US:
            for suffix in ("", "_waited"):
                found[f"mps_{name}{suffix}"] = {"error": f"MPS did not start: {error}"}
    return found


# -- the accy series -------------------------------------------------------------------------


def accy_series(plan: Plan, args: argparse.Namespace, iters: dict[str, int]) -> dict[str, Any]:
    """``accyd serve --catalog bench/catalog`` on a Unix socket and TCP; clients in processes."""
    from bench_service import EchoServer

    from accy.testing import free_port, running_daemon

    seconds, timeout = args.seconds, args.seconds * 4 + 60
    found: dict[str, Any] = {}

    def one(spec: Spec) -> dict[str, Any]:
        return run_workers([spec], run_timeout=timeout)[0]

    def many(specs: list[Spec]) -> dict[str, Any]:
        return _aggregate(run_workers(specs, run_timeout=timeout))

    def clients(into: dict[str, Any], target: str, tag: str, names: tuple[str, ...] = ()) -> None:
        """The N-client series: a wait every 16, and each launch waited for."""
        for name in names or tuple(TARGETS_US):
            for suffix, waited in (("", False), ("_waited", True)):
                specs = _rate_specs(
                    "accy-rate",
                    args.clients,
                    target=target,
                    iters=iters[name],
                    seconds=seconds,
                    waited=waited,
                )
                how = "each launch waited" if waited else "a wait every 16"
                into[f"clients_{name}{suffix}{tag}"] = plan.step(
                    f"accy {args.clients} clients{tag.replace('_', ' ')}, {name} kernel, {how}",
                    functools.partial(many, specs),
                )

    echo = EchoServer([f"127.0.0.1:{free_port()}"])
    extra = ["--catalog", str(CATALOG)]
    try:
        first = [*extra, "--engine-threads", str(args.engine_threads[0])]
        with running_daemon(backend=args.backend, extra=first, ready_timeout=90) as daemon:
            unix, tcp = daemon.unix_target, daemon.tcp_target
            found["round_trip"] = plan.step(
                "accy same-host round trip, tiny kernel",
                lambda: one(
                    {
                        "kind": "accy-rtt",
                        "target": unix,
                        "iters": iters["tiny"],
                        "iterations": args.iterations,
                    }
                ),
            )
            found["one_client"] = plan.step(
                "accy one client, short kernel, wait=False",
                lambda: one(
                    {
                        "kind": "accy-rate",
                        "index": 0,
                        "target": unix,
                        "iters": iters["short"],
                        "seconds": seconds,
                    }
                ),
            )
            clients(found, unix, "")
            for key, every in (("remote_rate", REMOTE_SYNC_EVERY), ("remote_rate_16", 16)):
                found[key] = plan.step(
                    f"accy remote (TCP) one client, tiny kernel, wait=False, waited every {every}",
                    functools.partial(
                        one,
                        {
                            "kind": "accy-rate",
                            "index": 0,
                            "target": tcp,
                            "iters": iters["tiny"],
                            "seconds": seconds,
                            "sync_every": every,
                        },
                    ),
                )
            found["remote_round_trip"] = plan.step(
                "accy remote (TCP) round trip against a streaming echo",
                lambda: one(
                    {
                        "kind": "accy-rtt",
                        "target": tcp,
                        "iters": iters["tiny"],
                        "iterations": args.iterations,
                        "echo": echo.addresses[0],
                    }
                ),
            )
            found["scan"] = plan.step(
                f"accy device_scan n={SCAN_N}, waited",
                lambda: one(
                    {
                        "kind": "accy-scan",
                        "target": unix,
                        "n": SCAN_N,
                        "iterations": max(50, args.iterations // 2),
                    }
                ),
            )
        for threads in args.engine_threads[
            1:
        ]:  # the engine with more threads, then the Python loop
            more = [*extra, "--engine-threads", str(threads)]
            with running_daemon(backend=args.backend, extra=more, ready_timeout=90) as daemon:
                clients(found, daemon.unix_target, f"_engine{threads}", ("short",))
        if args.python_engine:
            slow = [*extra, "--engine", "python"]
            with running_daemon(backend=args.backend, extra=slow, ready_timeout=90) as daemon:
                clients(found, daemon.unix_target, "_python_engine")
    finally:
        echo.close()
    return found


# -- main ------------------------------------------------------------------------------------


def _report_head(args: argparse.Namespace) -> dict[str, Any]:
    import grpc

    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "backend": args.backend,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "grpc": grpc.__version__,
        "clients": args.clients,
        "engine_threads": args.engine_threads,
        "seconds": args.seconds,
        "iterations": args.iterations,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--backend",
        choices=["cuda", "host"],
        default="cuda",
        help="cuda: baselines and accy series; host: the accy series only, small counts",
    )
    parser.add_argument("--out", type=Path, required=False, help="write every number here (JSON)")
    parser.add_argument("--clients", type=int, default=8, help="processes of the N-client series")
    parser.add_argument("--seconds", type=float, help="length of each rate series")
    parser.add_argument("--iterations", type=int, help="samples of each round-trip series")
    parser.add_argument("--budget", type=float, default=420.0, help="skip series after this (s)")
    parser.add_argument(
        "--engine-threads",
        default="0",
        help="native engine threads (0: the daemon's default): the first for every series, the "
        "others (comma-separated) for the N-client series on the short kernel again (each its "
        "own daemon)",
    )
    parser.add_argument(
        "--python-engine",
        action="store_true",
        help="the N-client series again on a daemon whose rings the Python loop takes",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(json.loads(args.worker), _prepare)
    host = args.backend == "host"
    if args.seconds is None:
        args.seconds = 0.5 if host else 2.0
    if args.iterations is None:
        args.iterations = 100 if host else 2000
    try:
        args.engine_threads = [int(n) for n in str(args.engine_threads).split(",")]
    except ValueError:
        parser.error("--engine-threads is a comma-separated list of thread counts")
    if args.clients < 1 or args.seconds <= 0 or args.iterations < 10:
        parser.error("--clients must be at least 1, --seconds positive, --iterations >= 10")

    plan = Plan(args.budget)
    report = _report_head(args)
    plan.say(f"sharing benchmark, {args.backend} backend, {args.clients} clients")
    with tempfile.TemporaryDirectory(prefix="accy-sharing-") as folder:
        if host:
            iters = dict(HOST_ITERS)
            report["kernels"] = {name: {"iters": n} for name, n in iters.items()}
        else:
            try:
                report["baselines"] = baselines(plan, args, Path(folder))
                inproc = report["baselines"]["in_process"]
                report["device"] = inproc["device"]
                report["kernels"] = inproc["kernels"]
                iters = {name: k["iters"] for name, k in inproc["kernels"].items()}
            except Exception as error:  # the accy series still run, on uncalibrated kernels
                plan.say(f"baselines failed: {error}; accy series on uncalibrated kernels")
                report.setdefault("baselines", {"error": f"{type(error).__name__}: {error}"})
                iters = dict(UNCALIBRATED_ITERS)
                report["kernels"] = {name: {"iters": n} for name, n in iters.items()}
        try:
            report["accy"] = accy_series(plan, args, iters)
        except Exception as error:  # the daemon or the echo server did not start
            plan.say(f"accy series failed: {error}")
            report["accy"] = {"error": f"{type(error).__name__}: {error}"}
    report["ratios"] = ratios(report)
    report["elapsed_s"] = time.monotonic() - plan.started
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        plan.say(f"wrote {args.out}")
    kernels = ", ".join(
        f"{name} iters={k['iters']}" + (f" {k['us']:.2f} µs" if "us" in k else "")
        for name, k in report["kernels"].items()
    )
    print(f"\n{report.get('device', args.backend + ' backend')}; kernels: {kernels}\n")
    print(series_table(report))
    print()
    print(goals_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
