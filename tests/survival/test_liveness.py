"""A client frozen (SIGSTOP) while the daemon streams a large read to it is still detached in time.

Its socket fills, so every write the daemon makes to that connection blocks:
the read's chunks and the Attach stream's heartbeats alike. Liveness must not
wait behind them: the client is detached within its liveness period plus 2 s.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Iterator

import pytest

from accy import Client
from accy.testing import RunningDaemon, running_daemon
from tests.survival.test_client_death import counts, spawn, wait_ready, wait_until
from tests.survival.victim import HUGE, LIVENESS

TRIES = 3
"""Frozen readers, one after another (the bug showed in about one try in three)."""
BOUND = LIVENESS + 2.0


@pytest.fixture(scope="module")
def daemon() -> Iterator[RunningDaemon]:
    with running_daemon(backend="host", tcp=False) as running:
        yield running
        assert running.process.poll() is None, f"accyd died:\n{running.log_text()}"


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (state T in /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


@pytest.mark.slow
def test_a_client_frozen_mid_read_is_detached_within_its_liveness(daemon: RunningDaemon) -> None:
    target = daemon.unix_target
    took: list[float] = []
    with Client(target, client_name="watcher") as watcher:
        baseline = counts(watcher)
        for _ in range(TRIES):
            victim = spawn("freeze", target)
            try:
                wait_ready([victim])
                assert wait_until(functools.partial(stopped, victim.pid), 5) is not None
                frozen = time.monotonic()
                held = counts(watcher)
                assert held["clients"] == baseline["clients"] + 1
                grown = held["device_memory_in_use"] - baseline["device_memory_in_use"]
                assert grown >= HUGE, held
                freed = wait_until(lambda: counts(watcher) == baseline, BOUND + 10, step=0.05)
                took.append(time.monotonic() - frozen)
                assert freed is not None, f"a frozen reader was never detached: {counts(watcher)}"
            finally:
                os.kill(victim.pid, signal.SIGKILL)
                victim.wait(10)
                victim.communicate()
    print(f"\nfrozen readers detached {[round(t, 2) for t in took]} s after they stopped")
    assert max(took) <= BOUND, took
