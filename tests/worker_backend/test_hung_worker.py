"""A device worker that stops answering (SIGSTOP) is declared lost in time and replaced."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from accyd.backends.worker.front.pool import DevicePool
from accyd.errors import DeviceFault

HANG = 1.5


def test_a_stopped_worker_is_lost_within_its_bound_and_its_calls_end() -> None:
    faults: list[tuple[int, DeviceFault]] = []
    lost = threading.Event()

    def on_fault(device: int, fault: DeviceFault) -> None:
        faults.append((device, fault))
        lost.set()

    pool = DevicePool("host", [0], on_fault=on_fault, hang_seconds=HANG)
    try:
        assert pool.wait_for_spares(60)
        worker = pool.backends[0]
        stream = worker.create_stream()
        buffer = worker.allocate_buffer(4096)
        os.kill(worker.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        outcome: list[BaseException] = []

        def copy() -> None:  # a round trip to the stopped worker: it must end
            try:
                worker.write(buffer, 0, b"\1" * 4096, stream)
            except BaseException as error:
                outcome.append(error)

        caller = threading.Thread(target=copy, daemon=True)
        caller.start()
        assert lost.wait(HANG + 5), "the stopped worker was never declared lost"
        took = time.monotonic() - stopped
        caller.join(5)
        assert not caller.is_alive(), "a call to the stopped worker still waits"
        assert outcome and isinstance(outcome[0], DeviceFault), outcome
        assert "stopped answering" in str(outcome[0])
        assert faults[0][0] == 0 and "stopped answering" in faults[0][1].message
        assert took < HANG + 1.5, f"declared lost {took:.2f} s after the stop"
        replaced = pool.replace(0)
        fresh = replaced.allocate_buffer(64)
        replaced.write(fresh, 0, b"\2" * 64, None)
        assert replaced.read(fresh, 0, 64, None) == b"\2" * 64
    finally:
        pool.close()


@pytest.mark.parametrize("busy_seconds", [2.5])
def test_a_worker_busy_with_a_long_copy_is_not_mistaken_for_a_hung_one(
    busy_seconds: float,
) -> None:
    """Heartbeats come from a thread of the worker's own: long work is not silence."""
    pool = DevicePool("host", [0], spares=False)  # the default bound
    try:
        worker = pool.backends[0]
        size = 256 << 20
        buffer = worker.allocate_buffer(size)
        started = time.monotonic()
        while time.monotonic() - started < busy_seconds:
            worker.write(buffer, 0, bytes(size), None)  # 256 MiB over the channel each time
        assert worker.alive and worker.fault is None
    finally:
        pool.close()
