"""Two devices behind one daemon: device_scan throughput on one device against two, and a fault
on device 1 that device 0's clients never see.

Run from the repository root (the host backend runs anywhere, small; the goals are for two H200s):

    python bench/two_devices.py [--backend host|cuda] [--n N] [--clients 16] [--seconds S]
                                [--json [PATH]]

One daemon serves the three phases: ``accyd serve --device 0 --device 1`` with device workers
(``ACCYD_DEVICE_WORKERS=1``; two devices turn them on anyway) and the faulting test catalog
(``tests/catalogs/faulty``), on a Unix socket. Every looping client is a process of its own
(``_two_devices_clients``), started and made ready (attached, device_scan loaded with scratch
for ``--n``, one launch checked in full against numpy) before a barrier releases all of a
phase's together; each counts its waited launches and checks every ``--check-every``-th result.

- A: ``--clients`` processes on device 0 for ``--seconds``; launches/s summed.
- B: the same number, half on device 0 and half on device 1; launches/s, and B/A (goal >= 1.9).
- C (``_two_devices_fault``): half of them loop on device 0, every result checked, while a
  client launches ``accy.test.fault`` on device 1 (the host kernel raises DeviceFault, the CUDA
  one writes through a wild pointer). Counted: device 0's checked results and errors (goal: no
  error); what the faulting launch got (goal: UNAVAILABLE, DEVICE_LOST, naming its session); the
  time from its answer to a probe's first checked result on device 1 (goal < 0.3 s); a client
  holding objects on both devices (device 0's keep working, device 1's read as lost);
  reattachments (goal: none); the status after (the same instance, both devices listed).

A markdown table of the numbers and goals prints last; ``--json`` writes everything. The exit
status is 1 where a phase failed or device 0's clients were not isolated from the fault.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from _two_devices_clients import Pool, worker_main
from _two_devices_fault import FaultOutcome, fault_phase, listed_devices

from accy._table import markdown
from accy.testing import RunningDaemon, running_daemon

__all__ = [
    "FaultOutcome",
    "device_workers_flag",
    "fault_phase",
    "isolated",
    "listed_devices",
    "main",
    "parse_args",
    "rate_phase",
    "table",
    "two_device_daemon",
]

ROOT = Path(__file__).resolve().parent.parent
FAULTY = ROOT / "tests" / "catalogs" / "faulty"
ACCYD = [sys.executable, "-c", "import sys; from accyd.cli import main; sys.exit(main())"]
WORKERS_FLAG = "--device-workers"
RATIO_GOAL, SERVING_GOAL = 1.9, 0.3
DEFAULTS = {
    "cuda": {"n": 1 << 26, "seconds": 5.0, "lead": 1.0},
    "host": {"n": 1 << 16, "seconds": 1.0, "lead": 0.5},
}
"""Per backend: elements per scan, seconds of phases A and B, seconds C runs before the fault."""


def device_workers_flag() -> bool:
    """Whether ``accyd serve`` offers device workers (one process per device, a warm spare)."""
    done = subprocess.run([*ACCYD, "serve", "--help"], capture_output=True, text=True, check=False)
    return WORKERS_FLAG in done.stdout


@contextmanager
def two_device_daemon(
    backend: str, ready_timeout: float = 120.0, *, one_gpu: bool = False
) -> Iterator[RunningDaemon]:
    """``accyd serve --device 0 --device 1`` with device workers and the faulty catalog;
    ``one_gpu``: both devices on GPU 0 (``--device-gpu 1=0``), two fault domains of one GPU."""
    extra: tuple[str, ...] = ("--device", "0", "--device", "1", "--catalog", str(FAULTY))
    if one_gpu:
        extra += ("--device-gpu", "1=0")
    env = {"ACCYD_DEVICE_WORKERS": "1"}
    with running_daemon(
        backend=backend, tcp=False, extra=extra, env=env, ready_timeout=ready_timeout
    ) as daemon:
        yield daemon


def rate_phase(
    target: str,
    devices: Sequence[int],
    n: int,
    seconds: float,
    check_every: int,
    ready_timeout: float = 120.0,
) -> dict[str, Any]:
    """One looping process per entry of ``devices`` (its device), released together for
    ``seconds``; their launches/s summed, in all and per device."""
    specs = [
        {
            "target": target,
            "name": f"two-devices-{i}",
            "device": device,
            "n": n,
            "seconds": seconds,
            "check_every": check_every,
            "seed": i,
        }
        for i, device in enumerate(devices)
    ]
    with Pool(specs) as pool:
        pool.ready(ready_timeout)
        pool.go()
        results = pool.results(timeout=seconds * 4 + 60)
    per_device: dict[str, float] = {}
    for result in results:
        key = str(result["device"])
        per_device[key] = per_device.get(key, 0.0) + result["per_second"]
    for result in results:
        del result["good_times"]
    return {
        "per_second": sum(r["per_second"] for r in results),
        "per_device": per_device,
        "launches": sum(r["launches"] for r in results),
        "checked": sum(r["checked"] for r in results),
        "errors": sum(r["errors"] for r in results),
        "max_full_check_error": max(r["full_check_error"] for r in results),
        "processes": results,
    }


# -- the report ------------------------------------------------------------------------------


def isolated(c: dict[str, Any]) -> bool:
    """Whether phase C showed the isolation the issue asks for (times and ratios aside)."""
    return (
        "error" not in c
        and c["device0_errors"] == 0
        and c["device0_reattachments"] == 0
        and (c["fault_code"], c["fault_reason"]) == ("UNAVAILABLE", "DEVICE_LOST")
        and c["fault_session_named"]
        and c["probe_good_s"] is not None
        and c["both_device0"] == "ok"
        and c["both_device1_buffer_lost"]
    )


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def _rate(value: float) -> str:
    return f"{value:,.0f}/s"


def _kinds(counts: dict[str, int]) -> str:
    return f" ({', '.join(f'{k}: {v}' for k, v in counts.items())})" if counts else ""


def _goal(measure: str, value: str, goal: str, met: bool) -> list[str]:
    return [measure, value, goal, _yes(met)]


def _rate_rows(report: dict[str, Any]) -> list[list[str]]:
    a, b = report.get("a", {}), report.get("b", {})
    half = report["clients"] // 2
    rows = []
    for name, phase, what in (
        ("A", a, f"{report['clients']} clients on device 0"),
        ("B", b, f"{half} + {half} clients on devices 0 and 1"),
    ):
        value = f"failed: {phase.get('error', 'not run')}"
        if "per_second" in phase:
            value = f"{_rate(phase['per_second'])} ({phase['errors']} errors)"
        rows.append([f"{name}: {what}, launches", value, "", ""])
    if a.get("per_second") and "per_second" in b:
        ratio = b["per_second"] / a["per_second"]
        rows.append(_goal("B / A", f"{ratio:.2f}x", f">= {RATIO_GOAL}x", ratio >= RATIO_GOAL))
    return rows


def _fault_rows(c: dict[str, Any]) -> list[list[str]]:
    if "fault_code" not in c:
        return [["C: fault on device 1", f"failed: {c.get('error', 'not run')}", "", ""]]
    checked, rates = c["device0_checked"], c["device0_rates"]
    named = c["fault_session_named"]
    fault = (c["fault_code"], c["fault_reason"])
    good = c["probe_good_s"]
    reattached = c["device0_reattachments"] + sum(c["reattachments"].values())
    devices = c["devices_listed"]
    spans = ("before", "until_device1_back", "after")
    return [
        [
            f"C: device 0 checked results ({c['loopers']} clients): before the fault / "
            "until device 1 is back / after",
            " / ".join(str(checked[k]) for k in spans),
            "",
            "",
        ],
        [
            "C: device 0 results/s before the fault / until device 1 is back",
            " / ".join(_rate(rates.get(k, 0.0)) for k in spans[:2]),
            "",
            "",
        ],
        _goal(
            "C: device 0 errors",
            str(c["device0_errors"]) + _kinds(c["device0_error_kinds"]),
            "0",
            c["device0_errors"] == 0,
        ),
        _goal(
            "C: the faulting launch got",
            f"{fault[0]} {fault[1]}, {'naming' if named else 'not naming'} its session",
            "UNAVAILABLE DEVICE_LOST, naming its session",
            fault == ("UNAVAILABLE", "DEVICE_LOST") and named,
        ),
        _goal(
            "C: fault answer -> first checked result on device 1 (probe)",
            "never" if good is None else f"{good * 1e3:.1f} ms",
            f"< {SERVING_GOAL} s",
            good is not None and good < SERVING_GOAL,
        ),
        [
            "C: probe errors before that",
            f"{len(c['probe_errors'])} in {c['probe_tries']} tries",
            "",
            "",
        ],
        _goal(
            "C: client on both devices, its device-0 objects",
            c["both_device0"][:80],
            "ok",
            c["both_device0"] == "ok",
        ),
        _goal(
            "C: its device-1 buffer",
            c["both_device1_buffer"][:80],
            "lost",
            c["both_device1_buffer_lost"],
        ),
        _goal("C: reattachments (every client)", str(reattached), "0", reattached == 0),
        _goal(
            "C: after: same daemon instance, devices in status",
            f"{_yes(not c['instance_changed'])}, {devices if devices is not None else 'none'}",
            "yes, [0, 1]",
            not c["instance_changed"] and devices == [0, 1],
        ),
    ]


def table(report: dict[str, Any]) -> str:
    """The markdown table of every phase's numbers against the issue's goals."""
    rows = _rate_rows(report) + _fault_rows(report.get("c", {}))
    return markdown(["measure", "value", "goal", "met"], rows)


# -- main ------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", choices=["host", "cuda"], default="host")
    parser.add_argument("--n", type=int, help="elements per scan (default 2**26 cuda, 2**16 host)")
    parser.add_argument("--clients", type=int, default=16, help="processes in A and B (even)")
    parser.add_argument("--seconds", type=float, help="length of A and B (5 cuda, 1 host)")
    parser.add_argument("--check-every", type=int, default=8, help="check this many's last (A, B)")
    parser.add_argument("--lead", type=float, help="seconds C loops before the fault, and after")
    parser.add_argument("--json", nargs="?", const="-", metavar="PATH", help="JSON to PATH or -")
    parser.add_argument(
        "--one-gpu",
        action="store_true",
        help="serve device 1 on GPU 0 too (two fault domains of one GPU): C shows a real fault "
        "spared by the neighbour on a one-GPU machine; B/A then says nothing about scaling",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return args
    for name, value in DEFAULTS[args.backend].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.clients < 2 or args.clients % 2:
        parser.error("--clients must be even and at least 2 (B puts half on each device)")
    if args.n < 1 or args.seconds <= 0 or args.check_every < 1 or args.lead < 0:
        parser.error("--n and --check-every must be at least 1, --seconds positive, --lead >= 0")
    return args


def _step(name: str, started: float, body: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one phase; its failure is recorded and the next phases still run."""
    print(f"[{time.monotonic() - started:6.1f} s] {name}...", flush=True)
    try:
        return body()
    except Exception as error:
        print(f"[{time.monotonic() - started:6.1f} s] {name}: FAILED: {error}", flush=True)
        return {"error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()}


def measure(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """Phases A, B and C on one daemon; their findings go into ``report``."""
    started = time.monotonic()
    clients, n = args.clients, args.n
    with two_device_daemon(args.backend, one_gpu=args.one_gpu) as daemon:
        target = daemon.unix_target
        report["a"] = _step(
            "A: all clients on device 0",
            started,
            lambda: rate_phase(target, [0] * clients, n, args.seconds, args.check_every),
        )
        report["b"] = _step(
            "B: half the clients on each device",
            started,
            lambda: rate_phase(
                target, [i % 2 for i in range(clients)], n, args.seconds, args.check_every
            ),
        )
        report["c"] = _step(
            "C: a fault on device 1",
            started,
            lambda: asdict(
                fault_phase(target, loopers=clients // 2, n=n, lead=args.lead, tail=args.lead)
            ),
        )
        if "error" in report["c"] or not isolated(report["c"]):
            report["daemon_log_tail"] = daemon.log_text()
    report["elapsed_s"] = time.monotonic() - started


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(json.loads(args.worker))
    import grpc

    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "backend": args.backend,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "grpc": grpc.__version__,
        "n": args.n,
        "clients": args.clients,
        "seconds": args.seconds,
        "check_every": args.check_every,
        "lead": args.lead,
        "one_gpu": args.one_gpu,
        "device_workers_flag": device_workers_flag(),
    }
    if not report["device_workers_flag"]:
        print(f"note: accyd serve has no {WORKERS_FLAG}: one process drives both devices")
    try:
        measure(args, report)
    except Exception as error:  # the daemon did not start
        report["error"] = f"{type(error).__name__}: {error}"
        print(f"the daemon did not start: {error}")
    if args.json:
        text = json.dumps(report, indent=2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    where = ", both devices on GPU 0" if args.one_gpu else ""
    print(f"\n{args.backend} backend, device_scan n={args.n}, {args.clients} clients{where}\n")
    if "error" not in report:
        print(table(report))
    phases_ran = all("error" not in report.get(k, {"error": 1}) for k in ("a", "b", "c"))
    return 0 if phases_ran and isolated(report["c"]) else 1


if __name__ == "__main__":
    sys.exit(main())
