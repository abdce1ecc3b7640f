"""Soak: many client processes against one daemon for minutes; zero errors and flat memory.

Run from the repository root (the daemon is started here, on a temporary Unix
socket, with the backend asked for):

    python bench/soak.py [--seconds 600] [--clients 32] [--backend host|cuda|auto] [--json PATH]

Each client process loops over a weighted mix until the time is up: device_scan,
saxpy and reduce_sum launches on buffers it writes, every result checked against
the float64 numpy reference; a buffer written and read back byte for byte; a
session loaded and released; now and then a second client attached for one
``run`` call and detached. Buffers are made and freed per step, so a leak shows.

Every ``--sample`` seconds the parent records the daemon process's resident set
(``VmRSS`` in ``/proc/PID/status``) and what ``GetStatus`` says (device memory
in use, clients, sessions, buffers). After a warm-up (a fifth of the run, at
most 60 s) the RSS samples are fitted with a line; its slope is the growth
trend. After the clients exit, the daemon's counts must be back to the
baseline. It exits 1 if any call failed or anything was left behind.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import queue
import statistics
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from accy import Client, references
from accy._table import markdown
from accy.client import Session
from accy.testing import running_daemon

SCAN, SUM, SAXPY = "accy.kernel.device_scan", "accy.kernel.reduce_sum", "accy.kernel.saxpy"
MiB = 1 << 20
MAX_ERRORS_KEPT = 20


# -- what one client process does -----------------------------------------------------------


class Mix:
    """One client's steps; each returns normally or raises (an error of the soak)."""

    def __init__(self, client: Client, rng: np.random.Generator) -> None:
        self.client = client
        self.rng = rng
        self.sessions: dict[str, Session] = {}

    def session(self, target: str) -> Session:
        if target not in self.sessions:
            self.sessions[target] = self.client.load(target)
        return self.sessions[target]

    def _checked(self, target: str, operands: list[np.ndarray[Any, Any]], **scalars: float) -> None:
        n = int(scalars["n"])
        session = self.session(target)
        reference = references.find(target)
        assert reference is not None
        out_count = 1 if target == SUM else n
        with self.client.empty(out_count, "f32") as out:
            inputs = [self.client.buffer(x) for x in operands]
            try:
                session.launch(inputs, [out], wait=bool(self.rng.integers(2)), **scalars).wait()
                got = out.read()
            finally:
                for buffer in inputs:
                    buffer.free()
        for comparison in references.compare(reference, operands, [got], scalars):
            if not comparison.ok:
                raise AssertionError(
                    f"{target} n={n}: relative error {comparison.error:.3g} "
                    f"> {comparison.tolerance:.3g}"
                )

    def _n(self) -> int:
        return int(self.rng.integers(1, 65_536))

    def scan(self) -> None:
        n = self._n()
        self._checked(SCAN, [self.rng.random(n, dtype=np.float32)], n=n)

    def saxpy(self) -> None:
        n = self._n()
        x, y = self.rng.random(n, dtype=np.float32), self.rng.random(n, dtype=np.float32)
        self._checked(SAXPY, [x, y], n=n, a=float(self.rng.uniform(-4, 4)))

    def reduce_sum(self) -> None:
        n = self._n()
        self._checked(SUM, [self.rng.random(n, dtype=np.float32)], n=n)

    def buffer_round_trip(self) -> None:
        data = self.rng.integers(0, 256, int(self.rng.integers(1, 2 * MiB)), dtype=np.uint8)
        with self.client.buffer(data) as buffer:
            back = buffer.read()
        if not np.array_equal(back, data):
            raise AssertionError(f"a buffer of {data.size} bytes read back different")

    def load_release(self) -> None:
        target = [SCAN, SUM, SAXPY][int(self.rng.integers(3))]
        session = self.sessions.pop(target, None) or self.client.load(target)
        session.release()

    def attach_detach(self) -> None:
        n = int(self.rng.integers(1, 4096))
        x = self.rng.random(n, dtype=np.float32)
        with Client(self.client.target, client_name="soak-second") as second:
            (got,) = second.run(SCAN, x)
        reference = references.find(SCAN)
        assert reference is not None
        (comparison,) = references.compare(reference, [x], [got], {"n": n})
        if not comparison.ok:
            raise AssertionError(f"run {SCAN} n={n}: relative error {comparison.error:.3g}")

    def steps(self) -> list[tuple[str, Callable[[], None], float]]:
        return [
            ("scan", self.scan, 6),
            ("saxpy", self.saxpy, 6),
            ("reduce_sum", self.reduce_sum, 6),
            ("buffer", self.buffer_round_trip, 4),
            ("load_release", self.load_release, 2),
            ("attach_detach", self.attach_detach, 1),
        ]


def soak_worker(
    target: str,
    seed: int,
    stop_at: float,
    calls: Synchronized[int],
    failures: Synchronized[int],
) -> dict[str, Any]:
    """Loop over the mix until ``stop_at`` (``time.time()``); returns counts and errors."""
    rng = np.random.default_rng(seed)
    done: Counter[str] = Counter()
    errors: list[str] = []
    try:
        client = Client(target, client_name=f"soak-{seed}")
    except Exception as error:
        failures.value += 1
        return {"seed": seed, "done": {}, "errors": [f"attach: {error}"], "error_count": 1}
    error_count = 0
    with client:
        mix = Mix(client, rng)
        steps = mix.steps()
        names = [name for name, _, _ in steps]
        weights = np.array([w for _, _, w in steps])
        weights = weights / weights.sum()
        while time.time() < stop_at:
            index = int(rng.choice(len(steps), p=weights))
            try:
                steps[index][1]()
            except Exception as error:
                error_count += 1
                with failures.get_lock():
                    failures.value += 1
                if len(errors) < MAX_ERRORS_KEPT:
                    where = traceback.format_exc(limit=3).strip().splitlines()[-1]
                    errors.append(f"{names[index]}: {type(error).__name__}: {error} ({where})")
                mix.sessions.clear()  # do not trust state after a failure
                continue
            done[names[index]] += 1
            with calls.get_lock():
                calls.value += 1
    return {"seed": seed, "done": dict(done), "errors": errors, "error_count": error_count}


def _worker_main(
    target: str,
    seed: int,
    stop_at: float,
    calls: Synchronized[int],
    failures: Synchronized[int],
    results: multiprocessing.Queue[dict[str, Any]],
) -> None:
    try:
        outcome = soak_worker(target, seed, stop_at, calls, failures)
    except BaseException as error:
        outcome = {"seed": seed, "done": {}, "errors": [repr(error)], "error_count": 1}
    results.put(outcome)


# -- the parent: daemon, samples, report ------------------------------------------------------


def serving_pid(pid: int) -> int:
    """The serving process: ``pid``'s newest descendant (``accyd serve`` may supervise one)."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    found = children.read_text().split() if children.exists() else []
    return serving_pid(int(found[-1])) if found else pid


def rss_bytes(pid: int) -> int:
    """The resident set of process ``pid`` (``VmRSS`` in ``/proc/PID/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


@dataclass
class Sample:
    t: float
    rss: int
    device_memory: int
    clients: int
    sessions: int
    buffers: int
    steps: int


@dataclass
class Report:
    seconds: float
    clients: int
    backend: str
    device: str
    warmup_seconds: float
    steps: int = 0
    launches: int = 0
    launches_failed: int = 0
    errors: int = 0
    error_messages: list[str] = field(default_factory=list)
    done: dict[str, int] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    baseline: dict[str, int] = field(default_factory=dict)
    after: dict[str, int] = field(default_factory=dict)
    leftover_seconds: float = 0.0

    @property
    def steady(self) -> list[Sample]:
        steady = [s for s in self.samples if self.warmup_seconds <= s.t <= self.seconds]
        return steady or self.samples

    def rss_slope_mib_per_min(self, part: slice = slice(None)) -> float:
        steady = self.steady[part]
        if len(steady) < 3:
            return 0.0
        t = np.array([s.t for s in steady])
        rss = np.array([s.rss for s in steady], dtype=np.float64) / MiB
        return float(np.polyfit(t, rss, 1)[0] * 60)

    def rss_at(self, where: str) -> int:
        steady = self.steady
        return {"start": steady[0], "mid": steady[len(steady) // 2], "end": steady[-1]}[where].rss

    @property
    def leaked(self) -> bool:
        return self.after != self.baseline

    def summary(self) -> dict[str, Any]:
        steady = self.steady
        return {
            "seconds": self.seconds,
            "clients": self.clients,
            "backend": self.backend,
            "device": self.device,
            "steps": self.steps,
            "steps_per_second": self.steps / self.seconds if self.seconds else 0.0,
            "errors": self.errors,
            "launches": self.launches,
            "launches_failed": self.launches_failed,
            "rss_first_mib": self.samples[0].rss / MiB if self.samples else None,
            "rss_start_mib": self.rss_at("start") / MiB,
            "rss_mid_mib": self.rss_at("mid") / MiB,
            "rss_end_mib": self.rss_at("end") / MiB,
            "rss_max_mib": max(s.rss for s in steady) / MiB,
            "rss_slope_mib_per_min": self.rss_slope_mib_per_min(),
            "rss_slope_halves_mib_per_min": [
                self.rss_slope_mib_per_min(slice(None, len(steady) // 2)),
                self.rss_slope_mib_per_min(slice(len(steady) // 2, None)),
            ],
            "device_memory_max": max(s.device_memory for s in self.samples),
            "device_memory_median": statistics.median(s.device_memory for s in steady),
            "sessions_max": max(s.sessions for s in self.samples),
            "buffers_max": max(s.buffers for s in self.samples),
            "baseline": self.baseline,
            "after": self.after,
            "freed_within_seconds": self.leftover_seconds,
            "leaked": self.leaked,
        }

    def table(self) -> str:
        s = self.summary()
        done = ", ".join(f"{k} {v:,}" for k, v in sorted(self.done.items()))
        rows = [
            ("clients (processes) x seconds", f"{self.clients} x {self.seconds:.0f} s"),
            ("backend", f"{self.backend} ({self.device})"),
            ("errors", f"{self.errors}"),
            ("checked steps done", f"{self.steps:,} ({s['steps_per_second']:.1f}/s)"),
            ("steps by kind", done),
            (
                "launches counted by the daemon (failed)",
                f"{self.launches:,} ({self.launches / self.seconds:.1f}/s; {self.launches_failed})",
            ),
            (
                f"daemon RSS after {self.warmup_seconds:.0f} s warm-up: start / mid / end",
                f"{s['rss_start_mib']:.1f} / {s['rss_mid_mib']:.1f} / {s['rss_end_mib']:.1f} MiB",
            ),
            (
                "daemon RSS at the first sample; max after warm-up",
                f"{s['rss_first_mib']:.1f} MiB; {s['rss_max_mib']:.1f} MiB",
            ),
            (
                "RSS trend after warm-up (least squares): all; first half, second half",
                "{:+.2f}; {:+.2f}, {:+.2f} MiB/min".format(
                    s["rss_slope_mib_per_min"], *s["rss_slope_halves_mib_per_min"]
                ),
            ),
            (
                "device memory in use: median / max while running",
                f"{s['device_memory_median'] / MiB:.1f} / {s['device_memory_max'] / MiB:.1f} MiB",
            ),
            ("sessions / buffers, max while running", f"{s['sessions_max']} / {s['buffers_max']}"),
            (
                "after the clients exit (clients, sessions, buffers, device bytes)",
                f"{_counts(self.after)}; baseline {_counts(self.baseline)}"
                f" (back within {self.leftover_seconds:.2f} s)",
            ),
        ]
        return markdown(["measure", "value"], rows)


def _counts(status: dict[str, int]) -> str:
    return "/".join(str(status.get(k, "?")) for k in COUNTS)


COUNTS = ("clients", "sessions", "buffers", "device_memory_in_use")


def status_counts(client: Client) -> dict[str, int]:
    """What the daemon holds, from ``GetStatus``: the counts a leak would raise."""
    status = client.status()
    return {key: int(getattr(status, key)) for key in COUNTS}


def run_soak(
    *,
    seconds: float,
    clients: int,
    backend: str,
    sample_seconds: float,
    progress: Callable[[str], None] = lambda line: None,
) -> Report:
    """Start a daemon, run ``clients`` processes for ``seconds``, sample, and check for leaks."""
    context = multiprocessing.get_context("spawn")
    with running_daemon(backend=backend, tcp=False) as daemon:
        pid = daemon.process.pid
        with Client(daemon.unix_target, client_name="soak-watcher") as watcher:
            report = Report(
                seconds=seconds,
                clients=clients,
                backend=watcher.attachment.backend,
                device=watcher.attachment.device_name,
                warmup_seconds=min(60.0, seconds / 5),
            )
            report.baseline = status_counts(watcher)
            first = watcher.status()
            calls = context.Value("q", 0)
            failures = context.Value("q", 0)
            stop_at = time.time() + seconds
            results = context.Queue()
            workers = [
                context.Process(
                    target=_worker_main,
                    args=(daemon.unix_target, seed, stop_at, calls, failures, results),
                    name=f"soak-{seed}",
                )
                for seed in range(clients)
            ]
            for worker in workers:
                worker.start()
            outcomes: list[dict[str, Any]] = []
            began = time.monotonic()
            next_sample = began
            while len(outcomes) < clients:
                wait = max(0.0, next_sample - time.monotonic())
                try:
                    outcomes.append(results.get(timeout=wait))
                    continue
                except queue.Empty:
                    pass
                if time.monotonic() - began > seconds + 120:
                    raise RuntimeError("the soak clients did not finish 120 s after the end")
                next_sample += sample_seconds
                counts = status_counts(watcher)
                sample = Sample(
                    t=time.monotonic() - began,
                    rss=rss_bytes(serving_pid(pid)),
                    device_memory=counts["device_memory_in_use"],
                    clients=counts["clients"],
                    sessions=counts["sessions"],
                    buffers=counts["buffers"],
                    steps=calls.value,
                )
                report.samples.append(sample)
                progress(
                    f"{sample.t:6.0f} s  steps {sample.steps:>9,}  errors {failures.value}  "
                    f"rss {sample.rss / MiB:7.1f} MiB  device {sample.device_memory / MiB:6.1f}"
                    f" MiB  clients {sample.clients:>3} sessions {sample.sessions:>3}"
                    f" buffers {sample.buffers:>3}"
                )
            for worker in workers:
                worker.join(30)
            done: Counter[str] = Counter()
            for outcome in outcomes:
                done.update(outcome["done"])
                report.errors += outcome["error_count"]
                report.error_messages += [
                    f"client {outcome['seed']}: {e}" for e in outcome["errors"]
                ]
            report.done = dict(done)
            report.steps = sum(done.values())
            freed_from = time.monotonic()
            deadline = freed_from + 10
            while True:
                report.after = status_counts(watcher)
                if not report.leaked or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            report.leftover_seconds = time.monotonic() - freed_from
            final = watcher.status()
            report.launches = final.launches_total - first.launches_total
            report.launches_failed = final.launches_failed - first.launches_failed
        if daemon.process.poll() is not None:
            report.errors += 1
            report.error_messages.append(f"accyd exited with {daemon.process.returncode}")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--backend", choices=["auto", "cuda", "host"], default="host")
    parser.add_argument("--sample", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--json", nargs="?", const="-", metavar="PATH", help="JSON to PATH or -")
    args = parser.parse_args(argv)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    started = time.strftime("%Y-%m-%d %H:%M:%S")
    report = run_soak(
        seconds=args.seconds,
        clients=args.clients,
        backend=args.backend,
        sample_seconds=args.sample,
        progress=progress,
    )
    for message in report.error_messages:
        print(f"error: {message}", file=sys.stderr)
    print(report.table())
    if args.json:
        document = {
            "started": started,
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "grpc": grpc.__version__,
            "command": " ".join(["python", *sys.argv]),
            "summary": report.summary(),
            "done": report.done,
            "errors": report.error_messages,
            "samples": [asdict(s) for s in report.samples],
        }
        text = json.dumps(document, indent=2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    return 1 if report.errors or report.leaked else 0


if __name__ == "__main__":
    sys.exit(main())
