"""Time from a device fault to serving again, and a second client getting right results after it.

Run from the repository root; each trial starts its own supervised daemon with
the faulting test catalog (so every trial restarts from the supervisor's first
back-off), on a temporary Unix socket:

    python bench/fault_recovery.py [--backend host|cuda] [--repeat N] [--json [PATH]]

In a trial, client B attaches, loads saxpy and checks one result; client A loads
``accy.test.fault`` and launches it (the host kernel raises ``DeviceFault``; the
CUDA kernel writes through a wild pointer, a sticky illegal address). From the
moment A's launch is sent, a watcher polls the health service every few
milliseconds. Recorded: when health first answers other than SERVING, what A
gets (status, ``ErrorInfo`` reason, whether its metadata names A's session),
when health answers SERVING again (a new daemon instance), and when B, still
the same ``Client`` (which reattaches by itself), first gets a checked saxpy
result on freshly written buffers; B's old buffer must then read as lost.
Medians over the trials are printed as a markdown table (``--json`` for all).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from accy import Client, errors, references
from accy._table import markdown
from accy.testing import RunningDaemon, running_daemon, serving

ROOT = Path(__file__).resolve().parent.parent
FAULTY = ROOT / "tests" / "catalogs" / "faulty"
FAULT, SAXPY = "accy.test.fault", "accy.kernel.saxpy"
ACCYD = [sys.executable, "-c", "import sys; from accyd.cli import main; sys.exit(main())"]
SUPERVISE_FLAG = "--no-supervise"
"""``accyd serve`` supervises itself (restarts after a fault) where its help offers this flag."""


def supervisor_built_in() -> bool:
    """Whether ``accyd serve`` restarts itself after a device fault (the default once wired)."""
    done = subprocess.run([*ACCYD, "serve", "--help"], capture_output=True, text=True, check=False)
    return SUPERVISE_FLAG in done.stdout


@dataclass
class Trial:
    """One fault and the recovery from it; times in seconds from A's launch."""

    not_serving: float | None = None
    serving_again: float | None = None
    b_good: float | None = None
    a_code: str = ""
    a_reason: str | None = None
    a_session: str = ""
    a_session_named: bool = False
    a_metadata: dict[str, str] = field(default_factory=dict)
    instance_changed: bool = False
    b_reattached: bool = False
    b_old_buffer: str = ""
    b_errors: list[str] = field(default_factory=list)


class HealthWatch:
    """Polls health on a thread; notes the first non-SERVING answer and the SERVING after it."""

    def __init__(self, target: str, began: float) -> None:
        self.target = target
        self.began = began
        self.down: float | None = None
        self.up: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            ok = serving(self.target, timeout=0.25)
            now = time.monotonic() - self.began
            if not ok and self.down is None:
                self.down = now
            if ok and self.down is not None:
                self.up = now
                return
            time.sleep(0.002)

    def wait(self, timeout: float) -> None:
        self._thread.join(timeout)
        self._stop.set()


def saxpy_round(client: Client, session: Any, rng: np.random.Generator) -> None:
    """Write fresh operands, launch saxpy, read the result back and check it against numpy."""
    n = 4096
    x, y = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
    a = float(rng.uniform(-2, 2))
    with client.buffer(x) as xs, client.buffer(y) as ys, client.empty(n, "f32") as out:
        session.launch([xs, ys], [out], n=n, a=a)
        got = out.read()
    reference = references.find(SAXPY)
    assert reference is not None
    (check,) = references.compare(reference, [x, y], [got], {"n": n, "a": a})
    if not check.ok:
        raise AssertionError(f"saxpy after the fault: relative error {check.error:.3g}")


def run_trial(target: str, timeout: float = 30.0) -> Trial:
    """Fault the daemon at ``target`` once through client A; B must recover on its own."""
    trial = Trial()
    rng = np.random.default_rng(7)
    with Client(target, client_name="B") as b, Client(target, client_name="A") as a:
        b_session = b.load(SAXPY)
        saxpy_round(b, b_session, rng)
        b_old = b.buffer(np.arange(16, dtype=np.float32))
        before = b.status().instance_id
        a_session = a.load(FAULT)
        x, y = a.buffer(np.ones(16, np.float32)), a.empty(16, "f32")
        trial.a_session = a_session.id
        began = time.monotonic()
        watch = HealthWatch(target, began)
        try:
            a_session.launch([x], [y], n=16)
            raise AssertionError("the faulting launch succeeded")
        except errors.AccyError as error:
            trial.a_code, trial.a_reason = error.code.name, error.reason
            trial.a_metadata = dict(error.metadata)
            trial.a_session_named = a_session.id in error.metadata.values()
        deadline = began + timeout
        while trial.b_good is None and time.monotonic() < deadline:
            try:
                saxpy_round(b, b_session, rng)
                trial.b_good = time.monotonic() - began
            except errors.AccyError as error:  # calls made while B reattaches may fail
                trial.b_errors.append(f"{type(error).__name__}: {error.message}")
                time.sleep(0.01)
        watch.wait(max(0.0, deadline - time.monotonic()))
        trial.not_serving, trial.serving_again = watch.down, watch.up
        trial.b_reattached = trial.b_good is not None
        trial.instance_changed = b.status().instance_id != before
        try:
            b_old.read()
            trial.b_old_buffer = "read back (wrong: it should be lost)"
        except errors.AccyError as error:
            trial.b_old_buffer = f"{type(error).__name__} ({error.reason})"
    return trial


@contextmanager
def faulty_daemon(backend: str) -> Iterator[RunningDaemon]:
    """A supervised ``accyd serve`` with the faulting test catalog, on a Unix socket."""
    with running_daemon(backend=backend, tcp=False, extra=("--catalog", str(FAULTY))) as daemon:
        yield daemon


def measure(backend: str, repeat: int) -> list[Trial]:
    trials = []
    for _ in range(repeat):
        with faulty_daemon(backend) as daemon:
            try:
                trials.append(run_trial(daemon.unix_target))
            except Exception:
                print(post_mortem(daemon), file=sys.stderr)
                raise
    return trials


def post_mortem(daemon: RunningDaemon) -> str:
    """What a failed recovery left: each process's threads and CPU, their stacks, the log."""
    group = str(daemon.process.pid)
    threads = subprocess.run(
        ["ps", "-L", "-o", "pid,tid,stat,pcpu,time,comm", "-g", group],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    # SIGUSR1 makes accyd (supervisor and server) print every thread's stack to its log.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(daemon.process.pid, signal.SIGUSR1)
    time.sleep(1.0)
    lines = daemon.log.read_text(errors="replace").splitlines()
    return "\n".join([threads, *(line[:300] for line in lines[-200:])])


def median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def table(trials: list[Trial]) -> str:
    def ms(value: float | None) -> str:
        return "never" if value is None else f"{value * 1e3:.1f} ms"

    def spread(name: str) -> str:
        values = [getattr(t, name) for t in trials]
        known = [v for v in values if v is not None]
        text = ms(median(values))
        if len(known) > 1:
            text += f" (min {ms(min(known))}, max {ms(max(known))})"
        return text

    first = trials[0]
    rows = [
        ("trials", str(len(trials))),
        ("fault -> health NOT_SERVING (median)", spread("not_serving")),
        ("fault -> health SERVING again, new instance (median)", spread("serving_again")),
        ("fault -> B's first checked result, same Client (median)", spread("b_good")),
        ("A's error", f"{first.a_code} {first.a_reason}"),
        ("A's error names A's session", f"{sum(t.a_session_named for t in trials)}/{len(trials)}"),
        ("daemon instance changed", f"{sum(t.instance_changed for t in trials)}/{len(trials)}"),
        ("B's buffer from before the fault", first.b_old_buffer),
    ]
    return markdown(["measure", "value"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["host", "cuda"], default="host")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", nargs="?", const="-", metavar="PATH", help="JSON to PATH or -")
    args = parser.parse_args(argv)
    if not supervisor_built_in():
        print(f"accyd serve has no built-in supervisor ({SUPERVISE_FLAG}): nothing restarts it")
        return 2
    trials = measure(args.backend, args.repeat)
    print(table(trials))
    if args.json:
        document = {
            "backend": args.backend,
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "grpc": grpc.__version__,
            "trials": [asdict(t) for t in trials],
        }
        text = json.dumps(document, indent=2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    recovered = all(t.serving_again is not None and t.b_good is not None for t in trials)
    return 0 if recovered else 1


if __name__ == "__main__":
    sys.exit(main())
