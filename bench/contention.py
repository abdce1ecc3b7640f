"""Sharing under contention: more waiting clients than CPUs, and a tenant that fills the GPU.

Run from the repository root (on a GPU machine about three minutes; every wait has a
deadline and a series past ``--budget`` is skipped):

    python bench/contention.py --out contention.json
    python bench/contention.py --backend host --clients 2,4 --seconds 0.3   # a smoke run

Series (clients are processes on the public client API, bench/catalog's kernels):

- **crowd**: K clients (``--clients``, default 8 and 32) each waiting for every launch of the
  short bench.fma kernel, on a daemon that publishes the rings' wait budget (the default)
  and on one started with ``--no-wait-budget`` (every client spins as its own CPU count
  says): kernels/s together, the slowest client over the mean, the worst client's p99.
- **noisy neighbour**: a victim tenant waiting for each short kernel, alone; beside an
  aggressor tenant pipelining bench.fill (every SM, calibrated to ``--aggressor-ms``); and
  beside the aggressor confined by the tokens file to a partition of ``--aggressor-sms``
  SMs. Victim p50/p99 and the aggressor's kernels/s; goals: the confined victim's p99 at
  most 1.2x alone, the confined aggressor at least 0.8x its unconfined rate of work (each
  variant calibrates its kernel to ``--aggressor-ms``, so a confined kernel does less: the
  rate compared is kernels/s times the kernel's iterations).
- **noisy neighbour under MPS** (CUDA only): the same kernels launched raw by a victim and
  an aggressor process under an MPS server: the victim alone, beside the aggressor, and
  beside the aggressor limited to ``--mps-percentage`` of the SMs
  (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``): MPS's own way to confine a client, in the same
  run as accy's partitions.

The table printed last holds every series.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _sharing_report import cell, crowd_summary
from _sharing_workers import Spec, run_workers
from bench_sharing import CATALOG, Plan

from accy.testing import running_daemon
from accyd.tokens import hash_token, new_token

ITERS = {"cuda": {"short": 3500, "fill": 60000}, "host": {"short": 8, "fill": 16}}
"""Short: about 8 µs on an H200; fill: a start for the calibration to ``--aggressor-ms``."""


def crowd(plan: Plan, args: argparse.Namespace, iters: int) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for count in args.clients:
        for name, flags in (("budget", []), ("no_budget", ["--no-wait-budget"])):
            extra = ["--catalog", str(CATALOG), *flags]

            def series(count: int = count, extra: list[str] = extra) -> dict[str, Any]:
                with running_daemon(backend=args.backend, tcp=False, extra=extra) as daemon:
                    specs: list[Spec] = [
                        {
                            "kind": "accy-rate",
                            "index": i,
                            "target": daemon.unix_target,
                            "iters": iters,
                            "seconds": args.seconds,
                            "waited": True,
                        }
                        for i in range(count)
                    ]
                    return crowd_summary(run_workers(specs, run_timeout=args.seconds * 4 + 60))

            found[f"crowd_{count}_{name}"] = plan.step(
                f"{count} clients waiting on the short kernel, {name.replace('_', ' ')}", series
            )
    return found


def _tokens(path: Path, tokens: dict[str, str], confined_sms: int | None) -> None:
    lines = []
    if confined_sms is not None:
        lines += ["[partitions]", f"aggressor = {{ sms = {confined_sms} }}", ""]
        lines += ["[tenant.aggressor]", 'partition = "aggressor"', ""]
    for tenant, token in tokens.items():
        lines += ["[[token]]", f'tenant = "{tenant}"', f'sha256 = "{hash_token(token)}"', ""]
    path.write_text("\n".join(lines))


def _victim(args: argparse.Namespace, kind: str, beside: bool, **more: Any) -> Spec:
    """A noisy-neighbour victim's spec (``_noisy_clients.py``), waiting for each short kernel."""
    return {
        "kind": kind,
        "iters": ITERS[args.backend]["short"],
        "seconds": args.seconds,
        "beside_aggressor": beside,
        **more,
    }


def _aggressor(args: argparse.Namespace, kind: str, **more: Any) -> Spec:
    """An aggressor's spec: bench.fill calibrated to ``--aggressor-ms`` (on CUDA), pipelined."""
    return {
        "kind": kind,
        "iters": ITERS[args.backend]["fill"],
        "target_ms": args.aggressor_ms if args.backend == "cuda" else 0.0,
        "seconds": args.seconds,
        **more,
    }


def _noisy_timeout(args: argparse.Namespace) -> float:
    return args.seconds * 4 + 90


def noisy(plan: Plan, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    tokens = {"victim": new_token(), "aggressor": new_token()}
    timeout = _noisy_timeout(args)
    found: dict[str, Any] = {}

    def victim(target: str, beside: bool) -> Spec:
        return _victim(args, "accy-victim", beside, target=target, token=tokens["victim"])

    def aggressor(target: str) -> Spec:
        return _aggressor(args, "accy-aggressor", target=target, token=tokens["aggressor"])

    for variant, sms in (("unconfined", None), ("confined", args.aggressor_sms)):
        path = folder / f"tokens-{variant}.toml"
        _tokens(path, tokens, sms)
        extra = ["--catalog", str(CATALOG), "--tokens", str(path), *args.daemon_flags]

        def pair(extra: list[str] = extra, variant: str = variant) -> dict[str, Any]:
            with running_daemon(backend=args.backend, tcp=False, extra=extra) as daemon:
                result: dict[str, Any] = {}
                if variant == "unconfined":
                    result["alone"] = run_workers(
                        [victim(daemon.unix_target, False)], run_timeout=timeout
                    )[0]
                hurt, loud = run_workers(
                    [victim(daemon.unix_target, True), aggressor(daemon.unix_target)],
                    run_timeout=timeout,
                )
                result |= {"victim": hurt, "aggressor": loud}
                log = daemon.log.read_text(errors="replace")
                result["partition_log"] = [
                    line[-300:] for line in log.splitlines() if "SM partitions" in line
                ]
                return result

        found[variant] = plan.step(f"noisy neighbour, aggressor {variant}", pair)
    return found


def noisy_mps(plan: Plan, args: argparse.Namespace) -> dict[str, Any]:
    """The victim and aggressor as raw CUDA processes under MPS: alone, beside, limited."""
    from _sharing_cuda import mps_log_tail, mps_server

    timeout = _noisy_timeout(args)

    def victim(beside: bool) -> Spec:
        return _victim(args, "cuda-victim", beside)

    def aggressor(percentage: int | None) -> Spec:
        return _aggressor(args, "cuda-aggressor", mps_thread_percentage=percentage)

    def series() -> dict[str, Any]:
        with mps_server() as variables:
            env = dict(os.environ) | variables
            found: dict[str, Any] = {
                "alone": run_workers([victim(False)], env=env, run_timeout=timeout)[0]
            }
            for name, percentage in (("unlimited", None), ("limited", args.mps_percentage)):
                hurt, loud = run_workers(
                    [victim(True), aggressor(percentage)], env=env, run_timeout=timeout
                )
                found[name] = {"victim": hurt, "aggressor": loud, "percentage": percentage}
            found["mps_log"] = mps_log_tail(variables)
            return found

    return plan.step("noisy neighbour under MPS", series)


def _held(
    alone: dict[str, Any] | None,
    found: dict[str, Any],
    free_kept: tuple[str, str] = ("unconfined", "confined"),
) -> tuple[float, float] | None:
    """How well the confinement held: the confined victim's p99 over ``alone``'s, and the
    confined aggressor's work over the free one's; ``None`` where a series is missing."""
    if alone is None:
        return None
    try:
        free, kept = found[free_kept[0]], found[free_kept[1]]
        return (
            kept["victim"]["p99_us"] / alone["p99_us"],
            _work(kept["aggressor"]) / _work(free["aggressor"]),
        )
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def _work(aggressor: dict[str, Any]) -> float:
    """The aggressor's iterations per second: its kernels/s alone compare kernels that each
    variant's calibration made of different lengths."""
    return float(aggressor["per_second"] * aggressor["iters"])


def table(report: dict[str, Any]) -> str:
    rows = [
        "| series | kernels/s | slowest/mean | p50 µs | p99 µs |",
        "| --- | --- | --- | --- | --- |",
    ]
    for key, found in report.get("crowd", {}).items():
        if "error" in found:
            rows.append(f"| {key} | {found['error'][:60]} | | | |")
            continue
        rows.append(
            f"| {key} | {cell(found['per_second'], 0)} | {cell(found['slowest_over_mean'], 2)} "
            f"| {cell(found['p50_us'])} | {cell(found['p99_us'])} |"
        )
    noisy_found = report.get("noisy", {})
    shown = []
    for variant in ("unconfined", "confined"):
        found = noisy_found.get(variant, {})
        if "error" in found:
            rows.append(f"| noisy {variant} | {found['error'][:60]} | | | |")
            continue
        if "alone" in found:
            alone = found["alone"]
            shown.append(("victim alone", alone, None))
        if "victim" in found:
            shown.append((f"victim, aggressor {variant}", found["victim"], found["aggressor"]))
    under_mps = report.get("noisy_mps", {})
    if "error" in under_mps:
        rows.append(f"| noisy under MPS | {under_mps['error'][:60]} | | | |")
    elif under_mps:
        shown.append(("MPS: victim alone", under_mps["alone"], None))
        for name in ("unlimited", "limited"):
            found = under_mps[name]
            limit = f" at {found['percentage']}% threads" if found["percentage"] else ""
            shown.append((f"MPS: victim, aggressor{limit}", found["victim"], found["aggressor"]))
    for name, hurt, loud in shown:
        rate = ""
        if loud is not None:
            rate = f"aggressor {cell(loud['per_second'], 0)} x {loud['iters']:,} iters"
        rows.append(f"| {name} | {rate} | | {cell(hurt['p50_us'])} | {cell(hurt['p99_us'])} |")
    held = _held(noisy_found.get("unconfined", {}).get("alone"), noisy_found)
    if held is not None:
        rows.append(
            f"\nconfined victim p99 / alone: {held[0]:.2f} (goal <= 1.2); confined "
            f"aggressor's work (kernels/s x iters) / unconfined: {held[1]:.2f} "
            "(goal >= 0.8); partitions: "
            f"{noisy_found['confined'].get('partition_log')}"
        )
    limited = _held(under_mps.get("alone"), under_mps, ("unlimited", "limited"))
    if limited is not None:
        rows.append(
            f"MPS, aggressor at {under_mps['limited']['percentage']}% threads: victim p99 / "
            f"alone {limited[0]:.2f}; aggressor's work / unlimited {limited[1]:.2f}"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", choices=["cuda", "host"], default="cuda")
    parser.add_argument("--out", type=Path, help="write every number here (JSON)")
    parser.add_argument("--clients", default="8,32", help="client counts of the crowd series")
    parser.add_argument("--seconds", type=float, default=2.0, help="length of each series")
    parser.add_argument("--aggressor-ms", type=float, default=2.0, help="its kernel's length")
    parser.add_argument(
        "--aggressor-sms", type=int, default=112, help="SMs of the confined aggressor"
    )
    parser.add_argument(
        "--mps-percentage", type=int, default=50, help="the MPS-limited aggressor's threads, %%"
    )
    parser.add_argument("--budget", type=float, default=360.0, help="skip series after this (s)")
    parser.add_argument(
        "--skip", default="", help="crowd, noisy and/or mps (CUDA only), comma-separated"
    )
    parser.add_argument(
        "--daemon-flags",
        default="",
        help="more accyd serve flags for the noisy neighbour's daemons ('--device-launch always')",
    )
    args = parser.parse_args(argv)
    args.clients = [int(n) for n in args.clients.split(",") if n]
    args.daemon_flags = shlex.split(args.daemon_flags)
    plan = Plan(args.budget)
    shown = dict(vars(args), out=str(args.out))
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "args": shown}
    skip = set(args.skip.split(","))
    with tempfile.TemporaryDirectory(prefix="accy-contention-") as folder:
        if "crowd" not in skip:
            report["crowd"] = crowd(plan, args, ITERS[args.backend]["short"])
        if "noisy" not in skip:
            report["noisy"] = noisy(plan, args, Path(folder))
        if "mps" not in skip and args.backend == "cuda":
            report["noisy_mps"] = noisy_mps(plan, args)
    report["elapsed_s"] = time.monotonic() - plan.started
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    print()
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
