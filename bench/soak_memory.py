"""Where a soaked daemon's memory goes: the soak's clients against a daemon in this process.

Run from the repository root:

    python bench/soak_memory.py [--seconds 1800] [--clients 6] [--sample 60]
        [--arena-max N] [--trim-seconds S] [--malloc-keep BYTES] [--json PATH]

The daemon (host backend, Unix socket, same-host rings: what ``bench/soak.py``
runs) serves in a thread of this process, so each sample can look inside it:
the resident set and its parts from ``/proc/self/smaps_rollup`` and
``/proc/self/smaps`` (heap, anonymous mappings, thread stacks), glibc's own
account (``mallinfo2``: memory its arenas hold, in use and free, and the
mapped blocks), Python's heap (``tracemalloc``, after ``gc.collect()``) with
the allocation sites that grew most since the first sample after warm-up,
and the thread count. Client processes run ``bench/soak.py``'s mix.

Each series is fitted with a line after the warm-up; its slope (MiB/min)
says which part of the process grows. ``--arena-max`` caps glibc's arenas
(``M_ARENA_MAX``), ``--trim-seconds`` calls ``malloc_trim(0)`` that often,
and ``--malloc-keep`` is the daemon's ``--malloc-keep-bytes``: runs with
and without them tell glibc's retention from a leak.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import gc
import json
import multiprocessing
import queue
import statistics
import sys
import tempfile
import threading
import time
import tracemalloc
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from soak import _worker_main

MiB = 1 << 20
_M_ARENA_MAX = -8


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _libc() -> ctypes.CDLL:
    name = ctypes.util.find_library("c")
    if name is None:
        raise RuntimeError("no C library found")
    return ctypes.CDLL(name)


def mallinfo() -> dict[str, int]:
    """glibc's account of its heaps: held from the system, in use, free, and mmapped blocks."""
    libc = _libc()
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return {
        "held": int(info.arena),
        "in_use": int(info.uordblks),
        "free": int(info.fordblks),
        "mapped": int(info.hblkhd),
    }


def smaps() -> dict[str, int]:
    """Resident bytes by kind of mapping: heap, anonymous, stacks, files."""
    parts = {"heap": 0, "anon": 0, "stack": 0, "file": 0}
    kind = "anon"
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if not fields:
            continue
        if "-" in fields[0] and len(fields) >= 5 and not fields[0].endswith(":"):
            name = fields[5] if len(fields) > 5 else ""
            if name == "[heap]":
                kind = "heap"
            elif name.startswith("[stack"):
                kind = "stack"
            elif name.startswith("/") or name.startswith("memfd:"):
                kind = "file"
            else:
                kind = "anon"
        elif fields[0] == "Rss:":
            parts[kind] += int(fields[1]) * 1024
    return parts


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@dataclass
class Sample:
    t: float
    rss: int
    python: int
    threads: int
    steps: int
    glibc: dict[str, int]
    maps: dict[str, int]


@dataclass
class Report:
    seconds: float
    clients: int
    options: dict[str, Any]
    samples: list[Sample] = field(default_factory=list)
    errors: int = 0
    grew: list[str] = field(default_factory=list)

    def slope(self, values: list[float], times: list[float]) -> float:
        if len(values) < 3:
            return 0.0
        return float(statistics.linear_regression(times, values).slope) * 60 / MiB

    def slopes(self, warmup: float) -> dict[str, float]:
        steady = [s for s in self.samples if s.t >= warmup]
        times = [s.t for s in steady]
        series: dict[str, list[float]] = {
            "rss": [s.rss for s in steady],
            "python heap": [s.python for s in steady],
        }
        for key in ("held", "in_use", "free", "mapped"):
            series[f"glibc {key}"] = [s.glibc[key] for s in steady]
        for key in ("heap", "anon", "stack", "file"):
            series[f"resident {key}"] = [s.maps[key] for s in steady]
        return {name: round(self.slope(values, times), 3) for name, values in series.items()}


def serve_here(folder: Path, malloc_keep: int | None) -> tuple[Any, asyncio.AbstractEventLoop]:
    """An ``accyd`` server on a Unix socket in ``folder``, on a loop in a thread of this process."""
    from accyd.logs import configure_logging
    from accyd.server import Server
    from accyd.settings.config import Config

    configure_logging("console", "warning")

    overrides: dict[str, Any] = {"listen": (f"unix:{folder / 's.sock'}",), "backend": "host"}
    if malloc_keep is not None:
        overrides["malloc_keep_bytes"] = malloc_keep
    config = Config.from_env(**overrides)
    server = Server(config)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="daemon-loop", daemon=True).start()
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(60)
    return server, loop


def run(args: argparse.Namespace, progress: Any) -> Report:
    libc = _libc()
    if args.arena_max:
        libc.mallopt(_M_ARENA_MAX, args.arena_max)
    tracemalloc.start(4)
    folder = Path(tempfile.mkdtemp(prefix="accy-soak-memory-"))
    server, loop = serve_here(folder, args.malloc_keep)
    target = f"unix:{folder / 's.sock'}"
    report = Report(
        args.seconds,
        args.clients,
        {
            "arena_max": args.arena_max,
            "trim_seconds": args.trim_seconds,
            "malloc_keep": args.malloc_keep,
        },
    )
    context = multiprocessing.get_context("spawn")
    calls, failures = context.Value("q", 0), context.Value("q", 0)
    results: multiprocessing.Queue[dict[str, Any]] = context.Queue()
    stop_at = time.time() + args.seconds
    workers = [
        context.Process(target=_worker_main, args=(target, seed, stop_at, calls, failures, results))
        for seed in range(args.clients)
    ]
    for worker in workers:
        worker.start()
    began = time.monotonic()
    warmup = min(300.0, args.seconds / 5)
    baseline: tracemalloc.Snapshot | None = None
    last_trim = began
    outcomes = 0
    next_sample = began
    while outcomes < args.clients:
        try:
            results.get(timeout=max(0.0, next_sample - time.monotonic()))
            outcomes += 1
            continue
        except queue.Empty:
            pass
        now = time.monotonic()
        if args.trim_seconds and now - last_trim >= args.trim_seconds:
            libc.malloc_trim(0)
            last_trim = now
        next_sample += args.sample
        gc.collect()
        snapshot = tracemalloc.take_snapshot()
        python = sum(stat.size for stat in snapshot.statistics("filename"))
        sample = Sample(
            t=now - began,
            rss=rss(),
            python=python,
            threads=threading.active_count(),
            steps=calls.value,
            glibc=mallinfo(),
            maps=smaps(),
        )
        report.samples.append(sample)
        if baseline is None and sample.t >= warmup:
            baseline = snapshot
        elif baseline is not None:
            top = snapshot.compare_to(baseline, "lineno")[:8]
            report.grew = [str(stat) for stat in top]
        progress(
            f"{sample.t:6.0f} s steps {sample.steps:>8,} errors {failures.value} "
            f"rss {sample.rss / MiB:6.1f} python {python / MiB:5.1f} "
            f"glibc held {sample.glibc['held'] / MiB:6.1f} in use "
            f"{sample.glibc['in_use'] / MiB:6.1f} free {sample.glibc['free'] / MiB:6.1f} "
            f"mapped {sample.glibc['mapped'] / MiB:5.1f} anon {sample.maps['anon'] / MiB:6.1f} "
            f"heap {sample.maps['heap'] / MiB:5.1f} threads {sample.threads}"
        )
    for worker in workers:
        worker.join(30)
    report.errors = failures.value
    asyncio.run_coroutine_threadsafe(server.stop(), loop).result(120)
    loop.call_soon_threadsafe(loop.stop)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=1800.0)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--sample", type=float, default=60.0)
    parser.add_argument("--arena-max", type=int, default=0)
    parser.add_argument("--trim-seconds", type=float, default=0.0)
    parser.add_argument("--malloc-keep", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    report = run(args, lambda line: print(line, flush=True))
    slopes = report.slopes(min(300.0, args.seconds / 5))
    print("slopes after the warm-up, MiB/min:")
    for name, value in slopes.items():
        print(f"  {name:<16} {value:+.3f}")
    print("python allocation sites that grew most since the warm-up:")
    for line in report.grew:
        print(f"  {line}")
    print(f"errors: {report.errors}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({**asdict(report), "slopes": slopes}, indent=1, default=str)
        )
    return 1 if report.errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
