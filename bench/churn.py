"""Churn: client processes of four kinds come and go, some SIGKILLed; the daemon must stay clean.

Run from the repository root (the daemon is started here, ``accyd serve`` on a
temporary Unix socket and a TCP loopback port, with JSON logs):

    python bench/churn.py [--minutes 10] [--workers 8] [--kill-share 0.2]
        [--life 0.5 6] [--sample 5] [--backend host|cuda|auto] [--json PATH|-]

For ``--minutes`` it keeps ``--workers`` client processes alive, each a life of
a random length (``--life``) and of one of four kinds, taken in turns in a random
order (``bench/_churn_workers.py``: an accy client on the shared-memory ring, one
over TCP with its ring carried by a RingStream, KServe ModelInfer calls, KServe
ModelStreamInfer streams), doing checked work. A share of them (``--kill-share``)
is SIGKILLed at a random moment of its life instead of ending it.

Before the churn, one life of each kind warms the daemon up; then its open
descriptors and what it holds (``GetStatus``: clients, sessions, buffers) are the
baseline. Every ``--sample`` seconds the serving process's resident set, open
descriptors and threads are read from ``/proc`` and the counts from
``GetStatus``. After the last life the daemon has ``--settle`` seconds to drop
the dead clients; then it is stopped with SIGTERM.

Goals (it exits 1 if one fails): no wrong result and no error in a life that
ended on its own; memory on a plateau (the mean resident set of the run's last
third within ``--rss-margin`` percent, or ``--rss-margin-mib``, whichever is
larger, of the middle third's); descriptors back within ``--fd-tolerance`` of
the baseline and the counts back to it; no line on the daemon's stdout or stderr
that is not a JSON log line (a traceback outside the structured log); the daemon
served throughout (no restart) and stopped with status 0. The table comes last.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from _churn_workers import ERRORS, KINDS, VERIFIED, WRONG, Counts, Life, live
from soak import COUNTS, rss_bytes, serving_pid, status_counts

from accy import Client
from accy._table import markdown
from accy.testing import RunningDaemon, running_daemon

MiB = 1 << 20


def descriptors(pid: int) -> int:
    """How many descriptors process ``pid`` holds open."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def threads(pid: int) -> int:
    """How many threads process ``pid`` runs (``Threads`` in ``/proc/PID/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise RuntimeError(f"no Threads for process {pid}")


def stray_lines(text: str) -> list[str]:
    """The lines of a daemon's output that are not JSON log lines (a traceback, a print)."""
    stray = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            entry = None
        if not isinstance(entry, dict) or "event" not in entry:
            stray.append(line)
    return stray


def levels(text: str) -> Counter[str]:
    """JSON log lines by level."""
    found: Counter[str] = Counter()
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            found[str(entry.get("level", "?"))] += 1
    return found


@dataclass
class Sample:
    t: float
    rss: int
    fds: int
    threads: int
    clients: int
    sessions: int
    buffers: int
    alive: int


@dataclass
class Goals:
    """The margins the run is judged by."""

    rss_margin: float = 0.10
    rss_margin_mib: float = 20.0
    fd_tolerance: int = 2


@dataclass
class Report:
    seconds: float
    workers: int
    backend: str
    device: str
    goals: Goals
    lives: Counter[str] = field(default_factory=Counter)
    kills: Counter[str] = field(default_factory=Counter)
    verified: int = 0
    wrong: int = 0
    errors: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    baseline: dict[str, int] = field(default_factory=dict)
    after: dict[str, int] = field(default_factory=dict)
    settle_seconds: float = 0.0
    stray: list[str] = field(default_factory=list)
    log_levels: Counter[str] = field(default_factory=Counter)
    restarts: int = 0
    exit_code: int | None = None

    def thirds(self) -> list[list[Sample]]:
        run = [s for s in self.samples if s.t <= self.seconds]
        cut = len(run) // 3
        return [run[:cut], run[cut : 2 * cut], run[2 * cut :]]

    @staticmethod
    def slope(samples: Sequence[Sample]) -> float:
        """The resident set's least-squares trend over ``samples``, MiB per minute."""
        if len(samples) < 3:
            return 0.0
        t = np.array([s.t for s in samples])
        rss = np.array([s.rss for s in samples], dtype=np.float64) / MiB
        return float(np.polyfit(t, rss, 1)[0] * 60)

    @staticmethod
    def mean_mib(samples: Sequence[Sample]) -> float:
        return float(np.mean([s.rss for s in samples]) / MiB) if samples else 0.0

    def plateau(self) -> tuple[float, float, float]:
        """The middle and last thirds' mean RSS (MiB) and the growth allowed between them."""
        _, middle, last = self.thirds()
        mid = self.mean_mib(middle)
        return mid, self.mean_mib(last), max(mid * self.goals.rss_margin, self.goals.rss_margin_mib)

    def failures(self) -> list[str]:
        """The goals not met, each in a few words; empty when the run passed."""
        failed = []
        if self.wrong:
            failed.append(f"{self.wrong} wrong results")
        if self.errors:
            failed.append(f"{len(self.errors)} lives ended in an error")
        if len(self.samples) < 6:
            failed.append(f"{len(self.samples)} samples: too few to judge a plateau")
        mid, last, allowed = self.plateau()
        if last - mid > allowed:
            failed.append(f"RSS grew {last - mid:.1f} MiB from the middle third to the last")
        fds = self.after.get("fds", 0) - self.baseline.get("fds", 0)
        if fds > self.goals.fd_tolerance:
            failed.append(f"{fds} descriptors more than the baseline at the end")
        counts = {k: v for k, v in self.after.items() if k in COUNTS}
        if counts != {k: v for k, v in self.baseline.items() if k in COUNTS}:
            failed.append(f"the daemon still holds {counts} (baseline {self.baseline})")
        if self.stray:
            failed.append(f"{len(self.stray)} lines of output outside the JSON log")
        if self.restarts:
            failed.append(f"the daemon restarted {self.restarts} times")
        if self.exit_code != 0:
            failed.append(f"the daemon exited with {self.exit_code} after SIGTERM")
        return failed

    def summary(self) -> dict[str, Any]:
        mid, last, allowed = self.plateau()
        run = [s for s in self.samples if s.t <= self.seconds]
        return {
            "seconds": self.seconds,
            "workers": self.workers,
            "backend": self.backend,
            "device": self.device,
            "goals": asdict(self.goals),
            "lives": sum(self.lives.values()),
            "lives_by_kind": dict(self.lives),
            "kills": sum(self.kills.values()),
            "kills_by_kind": dict(self.kills),
            "verified": self.verified,
            "wrong": self.wrong,
            "errors": len(self.errors),
            "rss_baseline_mib": self.baseline.get("rss", 0) / MiB,
            "rss_thirds_mean_mib": [self.mean_mib(part) for part in self.thirds()],
            "rss_thirds_slope_mib_per_min": [self.slope(part) for part in self.thirds()],
            "rss_max_mib": max((s.rss for s in run), default=0) / MiB,
            "rss_growth_mib": last - mid,
            "rss_growth_allowed_mib": allowed,
            "rss_end_mib": self.after.get("rss", 0) / MiB,
            "fds_max": max((s.fds for s in run), default=0),
            "threads_max": max((s.threads for s in run), default=0),
            "baseline": self.baseline,
            "after": self.after,
            "settle_seconds": self.settle_seconds,
            "stray_lines": len(self.stray),
            "log_levels": dict(self.log_levels),
            "restarts": self.restarts,
            "exit_code": self.exit_code,
            "failures": self.failures(),
        }

    def table(self) -> str:
        s = self.summary()
        kinds = ", ".join(
            f"{kind} {self.lives[kind]} ({self.kills[kind]} killed)" for kind in KINDS
        )
        means, slopes = s["rss_thirds_mean_mib"], s["rss_thirds_slope_mib_per_min"]
        b, a = self.baseline, self.after
        rows = [
            ("workers x minutes", f"{self.workers} x {self.seconds / 60:.1f}"),
            ("backend", f"{self.backend} ({self.device})"),
            ("client lives (SIGKILLed)", f"{s['lives']:,} ({s['kills']:,})"),
            ("lives by kind", kinds),
            ("results verified / wrong", f"{self.verified:,} / {self.wrong}"),
            ("lives ended in an error", f"{len(self.errors)}"),
            (
                "daemon RSS: baseline; thirds' means",
                f"{s['rss_baseline_mib']:.1f}; "
                + " / ".join(f"{m:.1f}" for m in means)
                + f" MiB (max {s['rss_max_mib']:.1f})",
            ),
            (
                "RSS trend per third (least squares)",
                " / ".join(f"{v:+.2f}" for v in slopes) + " MiB/min",
            ),
            (
                "plateau: last third - middle third",
                f"{s['rss_growth_mib']:+.1f} MiB (allowed {s['rss_growth_allowed_mib']:.1f})",
            ),
            (
                "descriptors: baseline / max / end",
                f"{b.get('fds')} / {s['fds_max']} / {a.get('fds')}",
            ),
            ("threads: max while running", f"{s['threads_max']}"),
            (
                "clients/sessions/buffers: end (baseline)",
                f"{_counts(a)} ({_counts(b)}), settled in {self.settle_seconds:.1f} s",
            ),
            (
                "output lines outside the JSON log",
                f"{len(self.stray)} (log lines: "
                + ", ".join(f"{k} {v}" for k, v in sorted(self.log_levels.items()))
                + ")",
            ),
            ("restarts; exit status after SIGTERM", f"{self.restarts}; {self.exit_code}"),
            ("goals", "; ".join(self.failures()) or "all met"),
        ]
        return markdown(["measure", "value"], rows)


def _counts(status: dict[str, int]) -> str:
    return "/".join(str(status.get(k, "?")) for k in ("clients", "sessions", "buffers"))


@dataclass
class Running:
    """A life in progress: its process, counts, report pipe and when to kill it (if ever)."""

    life: Life
    process: BaseProcess
    counts: Counts
    report: Connection
    kill_at: float | None


class Churn:
    """Starts, kills and reaps lives against one daemon; tallies them into a report."""

    def __init__(self, daemon: RunningDaemon, report: Report, args: argparse.Namespace) -> None:
        assert daemon.tcp_target is not None
        self.daemon, self.report, self.args = daemon, report, args
        self.context: ForkServerContext = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(["_churn_workers"])
        self.rng = random.Random(args.seed)
        self.seeds = iter(range(args.seed * 1_000_000, (args.seed + 1) * 1_000_000))
        self.running: list[Running] = []
        self.deck: list[str] = []

    def start(self, kind: str, seconds: float, kill: bool) -> None:
        life = Life(
            kind, next(self.seeds), seconds, self.daemon.unix_target, str(self.daemon.tcp_target)
        )
        counts = self.context.RawArray("q", 3)
        reader, writer = self.context.Pipe(duplex=False)
        process = self.context.Process(
            target=live, args=(life, counts, writer), name=f"churn-{kind}-{life.seed}"
        )
        process.start()
        writer.close()
        # killed somewhere past its first tenth, once it has a result (step)
        kill_at = time.monotonic() + seconds * self.rng.uniform(0.1, 0.9) if kill else None
        self.running.append(Running(life, process, counts, reader, kill_at))

    def start_random(self) -> None:
        """A life of the next kind of a shuffled deck (each kind a quarter of the lives, even
        in a short run), of a random length, killed or not at random."""
        if not self.deck:
            self.deck = self.rng.sample(KINDS, len(KINDS))
        low, high = self.args.life
        kill = self.rng.random() < self.args.kill_share
        self.start(self.deck.pop(), self.rng.uniform(low, high), kill)

    def step(self) -> None:
        """Kill the lives due, reap those that ended."""
        now = time.monotonic()
        for one in list(self.running):
            worked = one.counts[VERIFIED] + one.counts[WRONG] > 0  # killed mid-work, not mid-start
            if one.kill_at is not None and now >= one.kill_at and worked and one.process.is_alive():
                os.kill(one.process.pid or 0, signal.SIGKILL)
                one.kill_at = None
            if one.process.is_alive():
                continue
            one.process.join()
            self.running.remove(one)
            self.reap(one)

    def reap(self, one: Running) -> None:
        report = self.report
        report.lives[one.life.kind] += 1
        report.verified += one.counts[VERIFIED]
        report.wrong += one.counts[WRONG]
        if one.process.exitcode == -signal.SIGKILL:
            report.kills[one.life.kind] += 1
        elif one.report.poll():
            report.errors += one.report.recv()
        else:
            report.errors.append(
                f"{one.life.kind} #{one.life.seed} exited with {one.process.exitcode}"
                f" ({one.counts[ERRORS]} errors) and reported nothing"
            )
        one.report.close()

    def drain(self, timeout: float) -> None:
        """Let the lives in progress end (or be killed), within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.running:
            if time.monotonic() > deadline:
                for one in self.running:
                    one.process.kill()
                self.report.errors.append(f"{len(self.running)} lives did not end in time")
                deadline = float("inf")  # killed: reaped by the next steps
            self.step()
            time.sleep(0.05)


def held(pid: int, watcher: Client) -> dict[str, int]:
    """What the serving process holds now: memory, descriptors and the daemon's counts."""
    return {"rss": rss_bytes(pid), "fds": descriptors(pid), **status_counts(watcher)}


def back(now: dict[str, int], baseline: dict[str, int], fd_tolerance: int) -> bool:
    counts_back = all(now[k] == baseline[k] for k in COUNTS)
    return counts_back and now["fds"] <= baseline["fds"] + fd_tolerance


def settle(pid: int, watcher: Client, baseline: dict[str, int], args: argparse.Namespace) -> float:
    """Wait (at most ``--settle`` s) for the daemon to hold what it held at ``baseline``."""
    began = time.monotonic()
    while time.monotonic() - began < args.settle:
        if back(held(pid, watcher), baseline, args.fd_tolerance):
            break
        time.sleep(0.1)
    return time.monotonic() - began


def run_churn(args: argparse.Namespace, progress: Callable[[str], None]) -> Report:
    """Start the daemon, warm it up, churn for ``--minutes``, settle, stop; judge it."""
    seconds = args.minutes * 60
    extra = ["--log-format", "json", "--kserve-liveness-seconds", str(args.kserve_liveness)]
    goals = Goals(args.rss_margin / 100, args.rss_margin_mib, args.fd_tolerance)
    with running_daemon(backend=args.backend, tcp=True, extra=extra) as daemon:
        pid = serving_pid(daemon.process.pid)
        with Client(daemon.unix_target, client_name="churn-watcher") as watcher:
            report = Report(
                seconds, args.workers, watcher.attachment.backend,
                watcher.attachment.device_name, goals,
            )  # fmt: skip
            first = held(pid, watcher)
            churn = Churn(daemon, report, args)
            for kind in KINDS:  # warm-up: each kind once, so the baseline is a warm daemon's
                churn.start(kind, 2.0, kill=False)
            churn.drain(120)
            settle(pid, watcher, first, args)
            report.baseline = held(pid, watcher)
            if report.errors:
                report.errors.insert(0, f"in the warm-up ({dict(report.lives)}):")
            report.lives.clear()
            report.verified = 0  # wrong results and errors of the warm-up stay
            began = time.monotonic()
            next_sample = began
            while (now := time.monotonic()) - began < seconds:
                while len(churn.running) < args.workers:
                    churn.start_random()
                churn.step()
                if now >= next_sample:
                    next_sample += args.sample
                    counts = status_counts(watcher)
                    sample = Sample(
                        now - began, rss_bytes(pid), descriptors(pid), threads(pid),
                        counts["clients"], counts["sessions"], counts["buffers"],
                        len(churn.running),
                    )  # fmt: skip
                    report.samples.append(sample)
                    progress(
                        f"{sample.t:6.0f} s  lives {sum(report.lives.values()):>5}"
                        f" (killed {sum(report.kills.values()):>4})  verified {report.verified:>8,}"
                        f"  wrong {report.wrong}  errors {len(report.errors)}"
                        f"  rss {sample.rss / MiB:6.1f} MiB  fds {sample.fds:>4}"
                        f"  threads {sample.threads:>3}  clients {sample.clients:>3}"
                        f"  buffers {sample.buffers:>4}"
                    )
                time.sleep(0.02)
            churn.drain(args.life[1] + 60)
            report.settle_seconds = settle(pid, watcher, report.baseline, args)
            report.after = held(pid, watcher)
            report.restarts = watcher.status().restarts
        daemon.stop()
        report.exit_code = daemon.process.returncode
        text = daemon.log.read_text(errors="replace")
        report.stray = stray_lines(text)
        report.log_levels = levels(text)
    return report


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=8, help="client processes at once")
    parser.add_argument("--kill-share", type=float, default=0.2, help="lives SIGKILLed")
    parser.add_argument(
        "--life", type=float, nargs=2, default=[0.5, 6.0], metavar=("MIN", "MAX"),
        help="a life's length in seconds, uniform between MIN and MAX",
    )  # fmt: skip
    parser.add_argument("--sample", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--backend", choices=["auto", "cuda", "host"], default="host")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--kserve-liveness", type=float, default=10.0,
        help="the daemon's --kserve-liveness-seconds: a KServe caller on the Unix socket "
        "is dropped this long after its last call",
    )  # fmt: skip
    parser.add_argument("--settle", type=float, default=60.0, help="seconds to drop the dead")
    parser.add_argument("--rss-margin", type=float, default=10.0, help="percent")
    parser.add_argument("--rss-margin-mib", type=float, default=20.0)
    parser.add_argument("--fd-tolerance", type=int, default=2)
    parser.add_argument("--json", metavar="PATH", help="the report as JSON to PATH (- stdout)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    started = time.strftime("%Y-%m-%d %H:%M:%S")

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    report = run_churn(args, progress)
    for message in report.errors[:20]:
        print(f"error: {message}", file=sys.stderr)
    for line in report.stray[:20]:
        print(f"stray: {line}", file=sys.stderr)
    if args.json:
        document = {
            "started": started,
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "load_average_at_end": os.getloadavg(),
            "python": platform.python_version(),
            "grpc": grpc.__version__,
            "command": " ".join(["python", *sys.argv]),
            "summary": report.summary(),
            "errors": report.errors,
            "stray": report.stray[:100],
            "samples": [asdict(s) for s in report.samples],
        }
        text = json.dumps(document, indent=2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    print(report.table())
    return 1 if report.failures() else 0


if __name__ == "__main__":
    sys.exit(main())
