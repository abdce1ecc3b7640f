"""More waiting clients than CPUs: every one keeps progressing, none starves, latency bounded.

Eight client processes, each waiting for every launch of a small saxpy, share two CPUs with
a daemon on the host backend whose rings the native engine takes. The daemon tells them to
sleep at once (``accyd.ring.waiting``): spinning clients would take the CPUs its
engine and its kernels need to finish the launches they wait for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from accy.testing import running_daemon

pytestmark = pytest.mark.alone
"""Times its clients' latencies under load it makes itself: runs in a pytest process of its
own (scripts/test.sh)."""

CLIENTS = 8
CPUS = 2
SECONDS = float(os.environ.get("ACCY_CROWD_SECONDS", "4"))
FAIR_SHARE = 0.3
"""Each client's launches are at least this share of the mean."""
P99_MS = 250.0
CLIENT = Path(__file__).with_name("crowd_client.py")


@pytest.fixture
def two_cpus() -> Iterator[None]:
    """This process, and so the daemon and the clients it starts, on ``CPUS`` CPUs."""
    before = os.sched_getaffinity(0)
    if len(before) < CPUS:
        pytest.skip(f"needs {CPUS} CPUs")
    os.sched_setaffinity(0, sorted(before)[:CPUS])
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def run_crowd(extra: list[str]) -> list[dict[str, float]]:
    env = dict(os.environ, ACCY_RING="1")
    with running_daemon(backend="host", tcp=False, extra=["--engine", "native", *extra]) as daemon:
        clients = [
            subprocess.Popen(
                [sys.executable, str(CLIENT), daemon.unix_target, str(SECONDS)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for _ in range(CLIENTS)
        ]
        try:
            for client in clients:
                assert client.stdout is not None
                assert client.stdout.readline().strip() == "ready"
            for client in clients:
                assert client.stdin is not None
                client.stdin.write("go\n")
                client.stdin.flush()
            found = []
            for client in clients:
                out, _ = client.communicate(timeout=SECONDS + 60)
                assert client.returncode == 0, out
                found.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for client in clients:
                if client.poll() is None:
                    client.kill()
                    client.wait()
    return found


def test_more_waiting_clients_than_cpus_all_progress_with_bounded_latency(two_cpus: None) -> None:
    found = run_crowd([])
    counts = [r["count"] for r in found]
    mean = sum(counts) / len(counts)
    slowest = min(counts)
    summary = f"counts {counts}, p99 ms {[round(r['p99_ms'], 1) for r in found]}"
    assert slowest >= FAIR_SHARE * mean, f"a client starved: {summary}"
    assert max(r["p99_ms"] for r in found) < P99_MS, summary
