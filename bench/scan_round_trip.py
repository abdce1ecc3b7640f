"""device_scan's waited round trip taken apart: accy against the same kernels in one process.

Run from the repository root on a GPU machine (about a minute):

    python bench/scan_round_trip.py --out scan.json [--n 5000] [--iterations 2000]

In one run, each series a worker process (bench/_sharing_workers.py), every launch waited:

- **in-process** (bench/_scan_cuda.py): device_scan's one kernel (the single pass) from the
  daemon's own ``scan.cu`` launched raw with a stream synchronize; the same as a CUDA graph;
  the three reduce-then-scan kernels device_scan ran before; and the sharing benchmark's
  tiny kernel (the bound issue 20 set device_scan against);
- **accy**: ``accy.kernel.device_scan`` and the tiny kernel through a client on the Unix
  socket, against ``accyd serve`` with the CPU engine, then with ``--device-launch
  always`` (the GPU launches the record's checked graph itself).

The table printed last gives each p50/p99, accy over the same kernels in one process,
accy over the tiny kernel (issue 20's goal: <= 1.5x), and what accy adds to each kernel's
graph launched in process (accy replays a graph). Each accy series runs on its own
daemon, so the engine's counts and call times in the JSON are that series' own.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any

from _sharing_report import cell, lookup
from _sharing_workers import Spec, run_workers
from bench_sharing import CATALOG, HOST_ITERS, SCAN_N, Plan
from scale import engine_stats

from accy._table import markdown
from accy.testing import running_daemon

DAEMONS = {"engine": "", "device": "--device-launch always"}
"""accy's series: the daemon's flags for each."""


def one(spec: Spec, timeout: float) -> dict[str, Any]:
    return run_workers([spec], run_timeout=timeout)[0]


def accy(plan: Plan, args: argparse.Namespace, flags: str) -> dict[str, Any]:
    """device_scan and the tiny kernel, waited, each through its own daemon started with
    ``flags``, so each series' engine counts and call times are its own."""
    timeout = 120.0
    extra = ["--catalog", str(CATALOG), "--log-format", "json", *flags.split()]
    label = f"accy {flags}".strip()
    workers = {
        "scan": (
            f"device_scan n={args.n}",
            {"kind": "accy-scan", "n": args.n, "iterations": args.iterations, "warmup": 300},
        ),
        "tiny": (
            "tiny kernel",
            {"kind": "accy-rtt", "iters": HOST_ITERS["tiny"], "iterations": args.iterations},
        ),
    }
    found: dict[str, Any] = {}
    for name, (what, spec) in workers.items():
        with running_daemon(backend="cuda", tcp=False, extra=extra) as daemon:
            found[name] = plan.step(
                f"{label}: {what}, waited",
                functools.partial(one, spec | {"target": daemon.unix_target}, timeout),
            )
            daemon.stop()
            found[f"{name}_engine"] = engine_stats(daemon.log.read_text(errors="replace"))
    return found


def table(report: dict[str, Any]) -> str:
    def p(*path: str) -> tuple[float | None, float | None]:
        return (lookup(report, (*path, "p50_us")), lookup(report, (*path, "p99_us")))

    base_scan = lookup(report, ("in_process", "scan", "p50_us"))
    base_tiny = lookup(report, ("in_process", "tiny", "p50_us"))
    graphs = {
        "scan": lookup(report, ("in_process", "scan_graph", "p50_us")),
        "tiny": lookup(report, ("in_process", "tiny_graph", "p50_us")),
    }
    rows = []
    series: list[tuple[str, tuple[str, ...], str | None]] = [
        ("in-process: device_scan's kernel (one pass) + sync", ("in_process", "scan"), None),
        ("in-process: the one pass as a graph + sync", ("in_process", "scan_graph"), None),
        ("in-process: the 3 reduce-then-scan kernels + sync", ("in_process", "scan3"), None),
        ("in-process: tiny kernel + sync", ("in_process", "tiny"), None),
        ("in-process: tiny kernel as a graph + sync", ("in_process", "tiny_graph"), None),
    ]
    for name in DAEMONS:
        series += [
            (f"accy ({name}): device_scan, waited", ("accy", name, "scan"), "scan"),
            (f"accy ({name}): tiny kernel, waited", ("accy", name, "tiny", "launch"), "tiny"),
        ]
    for label, path, graph in series:
        p50, p99 = p(*path)
        over_scan = p50 / base_scan if p50 and base_scan else None
        over_tiny = p50 / base_tiny if p50 and base_tiny else None
        base = graphs.get(graph or "")
        beyond = p50 - base if p50 and base else None
        rows.append(
            [label, cell(p50), cell(p99), cell(over_scan, 2), cell(over_tiny, 2), cell(beyond)]
        )
    header = [
        "series",
        "p50 µs",
        "p99 µs",
        "x in-process scan",
        "x in-process tiny",
        "µs beyond its in-process graph",
    ]
    return markdown(header, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, help="write every number here (JSON)")
    parser.add_argument("--n", type=int, default=SCAN_N, help="device_scan's elements")
    parser.add_argument("--iterations", type=int, default=2000, help="samples of each series")
    parser.add_argument("--budget", type=float, default=240.0, help="skip series after this (s)")
    args = parser.parse_args(argv)
    if args.n < 1 or args.iterations < 10:
        parser.error("--n must be at least 1 and --iterations at least 10")
    plan = Plan(args.budget)
    report: dict[str, Any] = {"n": args.n, "iterations": args.iterations}
    report["in_process"] = plan.step(
        "in-process: device_scan's kernels, their graph, the tiny kernel",
        functools.partial(
            one,
            {
                "kind": "cuda-scan",
                "n": args.n,
                "iterations": args.iterations,
                "tiny_iters": HOST_ITERS["tiny"],
            },
            120.0,
        ),
    )
    report["accy"] = {name: accy(plan, args, flags) for name, flags in DAEMONS.items()}
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    device = report["in_process"].get("device", "?")
    launched = report["accy"]["device"].get("scan_engine", {}).get("device_launcher", {})
    print(f"\n{device}; device_scan n={args.n}; the device path's launcher: {launched}\n")
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
