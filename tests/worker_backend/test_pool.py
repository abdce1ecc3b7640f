"""``DevicePool``: actives and warm spares per device, replace, fault reports, close."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from accyd.backends.base import Backend
from accyd.backends.select import cuda_present
from accyd.backends.worker.front.pool import DevicePool
from accyd.backends.worker.front.proxy import WorkerBackend
from accyd.catalog import ArtifactFormat, load_catalog
from accyd.errors import DeviceFault, LaunchArgumentMismatch, Unavailable
from tests.pipeline_harness import CASES, run_case
from tests.worker_backend.conftest import gone, worker_children
from tests.worker_backend.test_faults import eventually

CATALOG = load_catalog()


def works(backend: Backend) -> bool:
    """A real pipeline runs right on ``backend``."""
    case = CASES["accy.kernel.saxpy"]
    error = run_case(backend, CATALOG, ArtifactFormat.HOST_PY, case, 1000, seed=1, pooled=True)
    return error < case.tolerance


def test_replace_promotes_the_warm_spare_and_starts_the_next() -> None:
    before = worker_children()
    faults: list[tuple[int, DeviceFault]] = []
    pool = DevicePool(
        "host", [0, 1], host_memory_limit=1 << 26, on_fault=lambda d, f: faults.append((d, f))
    )
    try:
        first = pool.backends
        assert sorted(first) == [0, 1]
        assert all(works(backend) for backend in first.values())
        assert pool.wait_for_spares(60)
        spare = pool.spares[0]
        old = first[0]
        assert isinstance(old, WorkerBackend)
        stale = old.allocate_buffer(64)
        started = time.perf_counter()
        replaced = pool.replace(0)
        took = time.perf_counter() - started
        assert replaced is spare  # a swap, not a cold start
        assert took < 1.0, took  # measured: about a millisecond (bench/worker_overhead.py)
        assert pool.backends == {0: spare, 1: first[1]}  # the other device is untouched
        assert works(replaced) and works(first[1])
        fresh = [replaced.allocate_buffer(64) for _ in range(3)]
        assert stale.id not in {b.id for b in fresh}  # ids are unique across workers
        with pytest.raises(LaunchArgumentMismatch, match="not allocated"):
            replaced.read(stale, 0, 8, None)  # a stale handle names nothing in the new one
        assert eventually(lambda: gone(old.pid))
        with pytest.raises(Unavailable, match="is closed"):
            old.allocate_buffer(8)
        assert pool.wait_for_spares(60)
        assert pool.spares[0].pid not in (old.pid, spare.pid)
    finally:
        pool.close()
    assert faults == []
    assert eventually(lambda: worker_children() <= before)


def test_faults_of_actives_are_reported_and_idle_spares_replaced_quietly() -> None:
    faults: list[tuple[int, str]] = []
    replaced = threading.Event()
    pool: DevicePool

    def on_fault(device: int, fault: DeviceFault) -> None:  # on the lost worker's reader
        faults.append((device, fault.message))
        pool.replace(device)  # as the daemon will: swap in the spare right here
        replaced.set()

    pool = DevicePool("host", [0, 1], on_fault=on_fault)
    try:
        assert pool.wait_for_spares(60)
        spare = pool.spares[0]
        os.kill(spare.pid, signal.SIGKILL)  # a spare lost while idle: no report
        assert eventually(lambda: pool.spares.get(0) not in (None, spare), 60)
        assert faults == []
        victim = pool.backends[1]
        assert isinstance(victim, WorkerBackend)
        os.kill(victim.pid, signal.SIGKILL)  # an active one lost while idle
        assert replaced.wait(30)
        assert faults == [
            (1, "the device worker for device 1 (host) faulted: it was killed by SIGKILL")
        ]
        assert pool.backends[1] is not victim and works(pool.backends[1])
        with pytest.raises(DeviceFault, match="killed by SIGKILL"):
            victim.allocate_buffer(8)
    finally:
        pool.close()
    assert len(faults) == 1


def test_without_spares_replace_starts_a_worker_cold() -> None:
    pool = DevicePool("host", [0], spares=False)
    try:
        old = pool.backends[0]
        assert pool.spares == {}
        new = pool.replace(0)
        assert new is not old and works(new)
        assert pool.spares == {}
    finally:
        pool.close()
    pool.close()  # idempotent
    with pytest.raises(Unavailable, match="closed"):
        pool.replace(0)


def test_close_ends_every_worker_active_spare_and_replaced() -> None:
    before = worker_children()
    pool = DevicePool("host", [0, 1])
    assert pool.wait_for_spares(60)
    workers = [*pool.backends.values(), *pool.spares.values()]
    pool.replace(0)  # the old one is killed; the next spare is starting
    assert len(worker_children() - before) >= 3
    pool.close()  # a spare still starting is ended too
    assert worker_children() <= before  # none left running, none left a zombie
    assert all(isinstance(w, WorkerBackend) and gone(w.pid) for w in workers)
    with pytest.raises(Unavailable, match="is closed"):
        pool.backends[1].allocate_buffer(8)


@pytest.mark.skipif(cuda_present(), reason="this machine has a GPU")
def test_auto_resolves_once_in_the_front() -> None:
    pool = DevicePool("auto", [0], spares=False)
    try:
        assert pool.kind == "host"
        buffer = pool.backends[0].allocate_buffer(16, zero=True)
        assert np.frombuffer(pool.backends[0].read(buffer, 0, 16, None), np.uint8).sum() == 0
    finally:
        pool.close()
