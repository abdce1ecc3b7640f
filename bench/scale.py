"""Waited launches at 1 to 32 client processes: accy against MPS and one process's C ceiling.

Run from the repository root on a GPU machine (about five minutes; every wait has a
deadline and a series past ``--budget`` is skipped):

    python bench/scale.py --out scale.json [--clients 1,8,16,32] [--seconds 1.5]

Every series runs the sharing benchmark's kernel (bench/catalog/fma.cu, 8 blocks of 128),
calibrated with CUDA events to a short (8 µs) and a long (46.5 µs) kernel. For each client
count K, in one run:

- **accy**: K processes on the public client API against one ``accyd serve --catalog
  bench/catalog``, each waiting for every launch (``wait=True``), and each waiting on its
  session every 16 launches; short and long kernels. Kernels/s together, the slowest
  client over the mean, and for waited launches the median client's p50 and the worst
  client's p99.
- **MPS**: K processes with cuda.bindings under an MPS control daemon, each synchronizing
  its stream after every launch, and every 16; short and long.
- **ceiling**: ``bench/ceiling.c`` built here, one process of K threads each launching
  the short and the long kernel and synchronizing after every launch, no checks.
- **several ceilings under MPS** (the moonshot's first candidate's bound): P processes of
  32/P threads each, the short kernel, waited, under MPS.

The table printed last holds every series, with the issue's goals.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _sharing_kernel import SYNC_EVERY
from _sharing_report import cell, crowd_summary, lookup
from _sharing_workers import Spec, run_workers
from bench_sharing import CATALOG, TARGETS_US, Plan

from accy._table import markdown
from accy.testing import running_daemon

WAYS = {"waited": 1, "every16": SYNC_EVERY}
"""How often each client waits: after every launch, or every 16."""
MPS_SPLITS = (4, 2)
"""Processes of the several-ceilings series (32 threads split over them)."""


def calibrate(plan: Plan, args: argparse.Namespace, image: Path) -> dict[str, Any]:
    """The in-process worker: compiles the kernel to ``image`` and finds each length's iters."""
    spec = {
        "kind": "cuda-inproc",
        "image_path": str(image),
        "seconds": 0.3,
        "iterations": 200,
        "tiny_iters": 1,
        "targets_us": TARGETS_US,
    }
    found = plan.step("calibrate", lambda: run_workers([spec], run_timeout=180)[0])
    if "error" in found:
        raise SystemExit(f"calibration failed: {found['error']}")
    return dict(found["kernels"])


def mps(plan: Plan, args: argparse.Namespace, image: Path, kernels: dict[str, Any]) -> Any:
    from _sharing_cuda import MpsUnavailable, mps_server

    found: dict[str, Any] = {}
    timeout = args.seconds * 4 + 90

    def series(env: dict[str, str], count: int, name: str, every: int) -> dict[str, Any]:
        specs: list[Spec] = [
            {
                "kind": "cuda-rate",
                "index": i,
                "image_path": str(image),
                "iters": kernels[name]["iters"],
                "seconds": args.seconds,
                "sync_every": every,
            }
            for i in range(count)
        ]
        return crowd_summary(run_workers(specs, env=env, run_timeout=timeout))

    try:
        with mps_server() as variables:
            env = dict(os.environ) | variables
            for count in args.clients:
                for name in TARGETS_US:
                    for way, every in WAYS.items():
                        found[f"{count}_{name}_{way}"] = plan.step(
                            f"MPS {count} processes, {name}, {way}",
                            functools.partial(series, env, count, name, every),
                        )
            if args.ceiling is not None:
                found["ceilings"] = plan.step(
                    "several ceilings under MPS",
                    lambda: several_ceilings(args, image, env),
                )
    except MpsUnavailable as error:
        plan.say(f"MPS did not start: {error}")
        found["error"] = str(error)
    return found


def accy(
    plan: Plan,
    args: argparse.Namespace,
    kernels: dict[str, Any],
    *,
    flags: str = "",
    counts: list[int] | None = None,
    cases: list[tuple[str, str]] | None = None,
    label: str = "accy",
) -> dict[str, Any]:
    """Every count and case through one daemon started with ``--daemon-args`` and ``flags``;
    each series with the CPUs it used (``bench/_cpu_use.py``)."""
    from _cpu_use import CpuUse

    found: dict[str, Any] = {}
    timeout = args.seconds * 4 + 90
    extra = ["--catalog", str(CATALOG), "--log-format", "json", "--engine-timings"]
    extra += [*args.daemon_args.split(), *flags.split()]
    every_case = [(name, way) for name in TARGETS_US for way in WAYS]
    with running_daemon(backend="cuda", tcp=False, extra=extra) as daemon:

        def series(count: int, name: str, way: str) -> dict[str, Any]:
            specs: list[Spec] = [
                {
                    "kind": "accy-rate",
                    "index": i,
                    "target": daemon.unix_target,
                    "iters": kernels[name]["iters"],
                    "seconds": args.seconds,
                    "waited": way == "waited",
                }
                for i in range(count)
            ]
            perf = None
            if args.perf_dir is not None and count == max(args.clients) and way == "waited":
                perf = args.perf_dir / f"{label}_{count}_{name}.perf"
            use = CpuUse(daemon.process.pid, perf_to=perf, perf_seconds=args.seconds * 0.6)
            summary = crowd_summary(run_workers(specs, run_timeout=timeout, window=use))
            return summary | {"cpu": use.found}

        for count in counts or args.clients:
            for name, way in cases or every_case:
                found[f"{count}_{name}_{way}"] = plan.step(
                    f"{label} {count} clients, {name}, {way}",
                    functools.partial(series, count, name, way),
                )
        daemon.stop()
        found["engine"] = engine_stats(daemon.log.read_text(errors="replace"))
    return found


def engine_stats(log: str) -> dict[str, Any]:
    """The native engine's counts and call times over the daemon's life, from its last line."""
    for line in reversed(log.splitlines()):
        if '"ring engine stopped"' in line:
            return dict(json.loads(line))
    return {}


def variants(plan: Plan, args: argparse.Namespace, kernels: dict[str, Any]) -> dict[str, Any]:
    """The ``--variant-ways`` series (waited unless told) at ``--variant-clients`` (default the
    smallest and largest count of 8 or more), on daemons started with each variant's flags
    (``--variants 'name=flags;...'``)."""
    if args.variant_clients:
        counts = [int(n) for n in args.variant_clients.split(",")]
    else:
        counts = sorted({c for c in args.clients if c >= 8})
        counts = [counts[0], counts[-1]] if len(counts) > 1 else counts
    ways = [way for way in args.variant_ways.split(",") if way]
    unknown = set(ways) - set(WAYS)
    if unknown:
        raise SystemExit(f"--variant-ways: {sorted(unknown)} are not among {sorted(WAYS)}")
    cases = [(name, way) for name in TARGETS_US for way in ways]
    found: dict[str, Any] = {}
    for entry in filter(None, (e.strip() for e in args.variants.split(";"))):
        name, _, flags = entry.partition("=")
        found[name] = {"flags": flags} | accy(
            plan, args, kernels, flags=flags, counts=counts, cases=cases, label=name
        )
    return found


def build_ceiling(folder: Path) -> Path | None:
    """``bench/ceiling.c`` compiled with the system's C compiler; None where there is none."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    program = folder / "ceiling"
    source = Path(__file__).with_name("ceiling.c")
    subprocess.run(
        [compiler, "-O2", "-pthread", "-o", str(program), str(source), "-ldl"], check=True
    )
    return program


def _ceiling_lines(output: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def ceiling(args: argparse.Namespace, image: Path) -> dict[str, Any]:
    """One process, K threads for each client count, per kernel length."""
    assert args.ceiling is not None
    found: dict[str, Any] = {}
    for name, target in TARGETS_US.items():
        done = subprocess.run(
            [str(args.ceiling), str(image), str(target), str(args.seconds)]
            + [str(count) for count in args.clients],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        for line in _ceiling_lines(done.stdout):
            found[f"{line['threads']}_{name}"] = line
    return found


def several_ceilings(args: argparse.Namespace, image: Path, env: dict[str, str]) -> Any:
    """P ceiling processes of 32/P threads each under MPS, at once: the short kernel."""
    assert args.ceiling is not None
    found: dict[str, Any] = {}
    for processes in MPS_SPLITS:
        threads = 32 // processes
        running = [
            subprocess.Popen(
                [
                    str(args.ceiling),
                    str(image),
                    str(TARGETS_US["short"]),
                    str(args.seconds),
                    str(threads),
                ],
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for _ in range(processes)
        ]
        lines = [_ceiling_lines(p.communicate(timeout=120)[0]) for p in running]
        rates = [line[0]["kernels_per_s"] for line in lines if line]
        found[f"{processes}x{threads}"] = {"per_second": sum(rates), "per_process": rates}
    return found


# -- the report -------------------------------------------------------------------------------


def _ratio(top: float | None, bottom: float | None) -> float | None:
    return None if top is None or not bottom else top / bottom


def tables(report: dict[str, Any], counts: list[int]) -> str:
    accy_found, mps_found, ceil = report["accy"], report["mps"], report["ceiling"]
    rows = []
    for count in counts:
        for name in TARGETS_US:
            for way in WAYS:
                key = f"{count}_{name}_{way}"
                mine = accy_found.get(key, {})
                theirs = lookup(mps_found, (key, "per_second"))
                c = lookup(ceil, (f"{count}_{name}", "kernels_per_s")) if way == "waited" else None
                p50, p99 = lookup(mine, ("p50_us",)), lookup(mine, ("p99_us",))
                rows.append(
                    [
                        str(count),
                        name,
                        way,
                        cell(lookup(mine, ("per_second",)), 0),
                        cell(lookup(mine, ("slowest_over_mean",)), 2),
                        cell(p50, 1),
                        cell(p99, 1),
                        cell(_ratio(p99, p50), 1),
                        cell(theirs, 0),
                        cell(_ratio(lookup(mine, ("per_second",)), theirs), 2),
                        cell(c, 0),
                        cell(_ratio(lookup(mine, ("per_second",)), c), 2),
                    ]
                )
    head = [
        "clients",
        "kernel",
        "waits",
        "accy k/s",
        "slowest/mean",
        "p50 µs",
        "p99 µs",
        "p99/p50",
        "MPS k/s",
        "x MPS",
        "ceiling k/s",
        "x ceiling",
    ]
    text = markdown(head, rows)
    several = mps_found.get("ceilings", {})
    if isinstance(several, dict) and "error" not in several:
        text += "\n\nSeveral ceilings under MPS, short kernel waited (processes x threads): "
        text += ", ".join(f"{k}: {cell(v['per_second'], 0)}/s" for k, v in several.items())
    return text + "\n\n" + goals(report, counts) + "\n\n" + cpu_table(report)


def cpu_table(report: dict[str, Any]) -> str:
    """Every accy series' CPU use: CPUs busy on average, and CPU-µs per launch."""
    rows = []
    sets = {"default": report["accy"]} | report.get("variants", {})
    for variant, found in sets.items():
        for key, series in found.items():
            if not isinstance(series, dict) or "cpu" not in series or not series["cpu"]:
                continue
            cpu, rate = series["cpu"], series["per_second"]
            engine = cpu["threads_cpus"].get("accy-engine", 0.0)
            others = cpu["process_cpus"] - engine
            clients = cpu["machine_cpus"] - cpu["process_cpus"]
            rows.append(
                [
                    variant,
                    key,
                    cell(rate, 0),
                    cell(lookup(series, ("p50_us",)), 1),
                    cell(lookup(series, ("p99_us",)), 1),
                    cell(series["slowest_over_mean"], 2),
                    cell(cpu["machine_cpus"], 1),
                    cell(engine, 2),
                    cell(others, 2),
                    cell(engine / rate * 1e6, 1),
                    cell(clients / rate * 1e6, 1),
                ]
            )
    head = ["variant", "series", "k/s", "p50 µs", "p99 µs", "slowest/mean", "busy CPUs"]
    head += ["engine CPUs", "daemon's other CPUs", "engine µs/launch", "clients' µs/launch"]
    return markdown(head, rows) + "\n\n" + engine_table(sets)


def engine_table(sets: dict[str, dict[str, Any]]) -> str:
    """Each daemon's engine over its life: calls per launch and µs per call."""
    kinds = ("launch", "record", "query", "query_ready", "wake")
    rows = []
    for variant, found in sets.items():
        stats = found.get("engine") or {}
        launches = stats.get("launches") or 0
        if not launches:
            continue
        calls, ns = stats["calls"], stats["call_ns"]
        row = [variant, cell(launches, 0), cell(stats["rounds"] / launches, 2)]
        row += [cell(calls[k] / launches, 2) for k in kinds]
        row += [cell(ns[k] / calls[k] / 1e3 if calls[k] else None, 2) for k in kinds]
        rows.append(row)
    head = ["variant", "launches", "rounds/launch"]
    head += [f"{k}/launch" for k in kinds] + [f"µs/{k}" for k in kinds]
    return markdown(head, rows)


def goals(report: dict[str, Any], counts: list[int]) -> str:
    a, m, c = report["accy"], report["mps"], report["ceiling"]
    top = max(counts)
    checks: list[tuple[str, float | None, str, bool | None]] = []

    def add(what: str, value: float | None, bound: float, at_least: bool = True) -> None:
        met = None if value is None else (value >= bound if at_least else value <= bound)
        checks.append((what, value, (">= " if at_least else "<= ") + f"{bound:g}", met))

    def rate(*keys: str) -> float | None:
        return lookup(a, keys)

    add(
        f"{top} waited short / ceiling",
        _ratio(
            rate(f"{top}_short_waited", "per_second"), lookup(c, (f"{top}_short", "kernels_per_s"))
        ),
        0.9,
    )
    if 8 in counts:
        add(
            f"{top} waited short / 8 waited short",
            _ratio(rate(f"{top}_short_waited", "per_second"), rate("8_short_waited", "per_second")),
            1.0,
        )
    for name, way, bound in (
        ("long", "waited", 0.9),
        ("short", "every16", 0.5),
        ("long", "every16", 0.9),
    ):
        key = f"{top}_{name}_{way}"
        add(
            f"{top} {way} {name} / MPS",
            _ratio(rate(key, "per_second"), lookup(m, (key, "per_second"))),
            bound,
        )
    for count in counts:
        for name in TARGETS_US:
            key = f"{count}_{name}_waited"
            add(
                f"{count} waited {name}: p99 / p50",
                _ratio(rate(key, "p99_us"), rate(key, "p50_us")),
                5.0,
                at_least=False,
            )
            for way in WAYS:
                add(
                    f"{count} {way} {name}: slowest / mean",
                    rate(f"{count}_{name}_{way}", "slowest_over_mean"),
                    0.9,
                )
    add(
        f"moonshot: {top} waited short / MPS",
        _ratio(
            rate(f"{top}_short_waited", "per_second"),
            lookup(m, (f"{top}_short_waited", "per_second")),
        ),
        1.0,
    )
    rows = [
        [what, cell(value, 2), bound, "-" if met is None else ("yes" if met else "no")]
        for what, value, bound, met in checks
    ]
    return markdown(["goal", "value", "bound", "met"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, help="write every number here (JSON)")
    parser.add_argument("--clients", default="1,8,16,32", help="client counts, comma-separated")
    parser.add_argument("--seconds", type=float, default=1.5, help="length of each series")
    parser.add_argument("--budget", type=float, default=420.0, help="skip series after this (s)")
    parser.add_argument("--daemon-args", default="", help="more flags for accyd serve")
    parser.add_argument("--skip", default="", help="accy, mps and/or ceiling, comma-separated")
    parser.add_argument(
        "--variants",
        default="",
        help="'name=flags;...': the waited series again on daemons started with these flags",
    )
    parser.add_argument(
        "--variant-ways", default="waited", help="the variants' series: waited and/or every16"
    )
    parser.add_argument(
        "--variant-clients", default="", help="the variants' client counts (comma-separated)"
    )
    parser.add_argument(
        "--perf-dir", type=Path, help="perf record the daemon in the largest waited series here"
    )
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.clients.split(",")]
    args.clients = counts
    skip = set(filter(None, args.skip.split(",")))
    plan = Plan(args.budget)
    report: dict[str, Any] = {"clients": counts, "seconds": args.seconds}
    with tempfile.TemporaryDirectory(prefix="accy-scale-") as folder:
        image = Path(folder) / "fma.image"
        kernels = report["kernels"] = calibrate(plan, args, image)
        args.ceiling = None if "ceiling" in skip else build_ceiling(Path(folder))
        report["ceiling"] = (
            {} if args.ceiling is None else plan.step("ceiling", lambda: ceiling(args, image))
        )
        # The baselines first: a run past its budget skips the last series, never these.
        report["mps"] = {} if "mps" in skip else mps(plan, args, image, kernels)
        report["accy"] = {} if "accy" in skip else accy(plan, args, kernels)
        report["variants"] = variants(plan, args, kernels)
    report["elapsed_s"] = time.monotonic() - plan.started
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    lengths = ", ".join(f"{k} {v.get('us', 0):.2f} µs" for k, v in kernels.items())
    print(f"\nkernels: {lengths}\n")
    print(tables(report, counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
