"""Client processes killed (SIGKILL) mid-stream and mid-launch lose everything; others never notice.

How the daemon notices: a client's Attach stream lives on its connection. When
the process dies, its kernel closes the socket; the server's transport sees the
end of the connection at once and cancels every call on it, the Attach handler
among them, whose ``finally`` detaches the client: its sessions' streams are
synchronized (the work it queued finishes), then its sessions, scratch and
buffers are freed. A client that hangs without closing its connection (a frozen
process, a vanished host) is found by the server's keepalive pings instead:
no answer within ``keepalive_seconds + keepalive_timeout_seconds`` (2 + 3 s by
default) closes the connection the same way.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from accy import Client, references
from accy.testing import RunningDaemon, running_daemon
from tests.survival.victim import LIVENESS

VICTIM = Path(__file__).with_name("victim.py")
MODES = ("write", "read", "launch", "wait", "mixed")
WAVES, PER_WAVE = 5, 10
DETACH_GRACE = 5.0
"""The issue's bound: a dead client's resources are freed within 5 s (the default)."""
COUNTS = ("clients", "sessions", "buffers", "device_memory_in_use")
SCAN, SAXPY = "accy.kernel.device_scan", "accy.kernel.saxpy"
STEADY_MAX_N = 1 << 16


@pytest.fixture(scope="module")
def daemon() -> Iterator[RunningDaemon]:
    with running_daemon(backend="host", tcp=False) as running:
        yield running
        assert running.process.poll() is None, f"accyd died:\n{running.log_text()}"


def counts(client: Client) -> dict[str, int]:
    status = client.status()
    return {key: int(getattr(status, key)) for key in COUNTS}


def watch_release(
    watcher: Client, baseline: dict[str, int], since: float, timeout: float
) -> tuple[float, float]:
    """Seconds from ``since`` until the clients count, then every count, were back to baseline."""
    detected: float | None = None
    while True:
        now = counts(watcher)
        elapsed = time.monotonic() - since
        if detected is None and now["clients"] == baseline["clients"]:
            detected = elapsed
        if now == baseline:
            assert detected is not None
            return detected, elapsed
        assert elapsed < timeout, f"still held {elapsed:.1f} s after the kill: {now} vs {baseline}"
        time.sleep(0.01)


def wait_until(check: Callable[[], bool], timeout: float, step: float = 0.01) -> float | None:
    """Seconds until ``check()`` held, or ``None`` if it did not within ``timeout``."""
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > timeout:
            return None
        time.sleep(step)
    return time.monotonic() - began


def checked(
    target: str, operands: list[np.ndarray[Any, Any]], got: np.ndarray[Any, Any], **scalars: float
) -> str | None:
    """``None`` if ``got`` matches the numpy reference, else what is wrong."""
    reference = references.find(target)
    assert reference is not None
    (comparison,) = references.compare(reference, operands, [got], scalars)
    return None if comparison.ok else f"{target} {scalars}: error {comparison.error:.3g}"


@dataclass
class Steady:
    """A well-behaved client in a thread: saxpy and scan on its own buffers, checked each time.

    Its session, scratch and buffers are made once, up front, so the daemon's
    counts stay constant while it runs and can be compared to a baseline.
    """

    target: str
    done: int = 0
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.client = Client(self.target, client_name="steady")
        self.saxpy = self.client.load(SAXPY)
        self.scan = self.client.load(SCAN)
        self.scan.allocate_intermediates(n=STEADY_MAX_N)
        self.x, self.y, self.out = (self.client.empty(STEADY_MAX_N, "f32") for _ in range(3))
        self.thread = threading.Thread(target=self._loop, name="steady", daemon=True)

    def _step(self, rng: np.random.Generator) -> str | None:
        n = int(rng.integers(1, STEADY_MAX_N))
        x, y = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
        a = float(rng.uniform(-3, 3))
        self.x.write(x)
        self.y.write(y)
        self.saxpy.launch([self.x, self.y], [self.out], n=n, a=a)
        wrong = checked(SAXPY, [x, y], self.out.read(count=n), n=n, a=a)
        if wrong:
            return wrong
        self.scan.launch([self.x], [self.out], n=n)
        return checked(SCAN, [x], self.out.read(count=n), n=n)

    def _loop(self) -> None:
        rng = np.random.default_rng(11)
        while not self._stop.is_set():
            try:
                wrong = self._step(rng)
            except Exception as error:
                wrong = f"{type(error).__name__}: {error}"
            if wrong:
                self.errors.append(wrong)
            else:
                self.done += 1

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(30)
        self.client.close()


def spawn(mode: str, target: str, liveness: float | None = None) -> subprocess.Popen[str]:
    env = None if liveness is None else {**os.environ, "ACCY_VICTIM_LIVENESS": str(liveness)}
    return subprocess.Popen(
        [sys.executable, str(VICTIM), mode, target],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def wait_ready(victims: list[subprocess.Popen[str]], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    for victim in victims:
        assert victim.stdout is not None
        line = ""
        while line.strip() != "READY":
            # readline blocks, but a victim that fails exits and closes stdout
            line = victim.stdout.readline()
            if not line and victim.poll() is not None:
                _, error = victim.communicate()
                raise AssertionError(f"a victim exited with {victim.returncode}:\n{error}")
            assert time.monotonic() < deadline, "the victims did not get ready"


def test_fifty_clients_killed_mid_stream_and_mid_launch_free_everything(
    daemon: RunningDaemon,
) -> None:
    target = daemon.unix_target
    watcher = Client(target, client_name="watcher")
    steady = Steady(target)
    baseline = counts(watcher)
    steady.start()
    rng = random.Random(4)
    freed_after: list[float] = []
    detected_after: list[float] = []
    progress: list[int] = []
    try:
        for wave in range(WAVES):
            modes = [MODES[(wave * PER_WAVE + i) % len(MODES)] for i in range(PER_WAVE)]
            done_before = steady.done
            # Killed, not silent: a long liveness keeps a late ping from detaching one first.
            victims = [spawn(mode, target, liveness=30) for mode in modes]
            try:
                wait_ready(victims)
                during = counts(watcher)
                assert during["clients"] == baseline["clients"] + PER_WAVE
                assert during["sessions"] >= baseline["sessions"] + PER_WAVE
                assert during["device_memory_in_use"] > baseline["device_memory_in_use"]
                killed = time.monotonic()
                for victim in victims:
                    time.sleep(rng.uniform(0.0, 0.02))
                    os.kill(victim.pid, signal.SIGKILL)
            finally:
                for victim in victims:
                    if victim.poll() is None:
                        victim.kill()
                    victim.wait(10)
                    victim.communicate()
            assert all(v.returncode == -signal.SIGKILL for v in victims), [
                v.returncode for v in victims
            ]
            detected, freed = watch_release(watcher, baseline, killed, timeout=30)
            detected_after.append(detected)
            freed_after.append(freed)
            progress.append(steady.done - done_before)
            assert not steady.errors, steady.errors[:5]
    finally:
        steady.stop()
    print(
        f"\n{WAVES * PER_WAVE} clients killed; detach noticed within "
        f"{max(detected_after):.3f} s, everything freed within {max(freed_after):.3f} s "
        f"(per wave: {[round(t, 3) for t in freed_after]}); steady client checked "
        f"{steady.done} results ({progress} during the waves)"
    )
    assert not steady.errors, steady.errors[:5]
    assert max(freed_after) <= DETACH_GRACE, freed_after
    assert all(count > 0 for count in progress), "the steady client stalled during a wave"
    # Everything, the steady client's too, is gone once it and the watcher detach.
    watcher.close()
    with Client(target) as fresh:
        assert wait_until(lambda: counts(fresh) == {**dict.fromkeys(COUNTS, 0), "clients": 1}, 10)


def test_a_frozen_client_is_detached_when_it_stops_pinging(daemon: RunningDaemon) -> None:
    """SIGSTOP keeps the socket open: the client's silence past its liveness period tells."""
    target = daemon.unix_target
    with Client(target, client_name="watcher") as watcher:
        baseline = counts(watcher)
        victim = spawn("write", target)
        try:
            wait_ready([victim])
            os.kill(victim.pid, signal.SIGSTOP)
            stopped = time.monotonic()
            assert counts(watcher)["clients"] == baseline["clients"] + 1
            freed = wait_until(lambda: counts(watcher) == baseline, 12, step=0.05)
            assert freed is not None, f"a frozen client was never detached: {counts(watcher)}"
            took = time.monotonic() - stopped
        finally:
            victim.kill()
            victim.wait(10)
            victim.communicate()
    print(f"\na frozen client was detached {took:.2f} s after SIGSTOP")
    assert took <= LIVENESS + 1 + DETACH_GRACE  # silence past liveness, a check, the grace
