"""A lost worker: a device fault, a kill, a failed start, a close, a dropped proxy."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from accyd.backends.select import cuda_present
from accyd.backends.worker.front.proxy import WorkerBackend
from accyd.errors import DeviceFault, Unavailable, UnsupportedOperation
from accyd.process.exits import EXIT_DEVICE_LOST
from tests.worker_backend.conftest import Kernels, gone, worker_children


def eventually(condition: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_device_fault_ends_the_worker_and_every_call_after_it(tmp_path: Path) -> None:
    faults: list[DeviceFault] = []
    backend = WorkerBackend("host", 0, on_fault=faults.append, host_memory_limit=1 << 26)
    kernels = Kernels(backend, tmp_path)
    buffer = backend.allocate_buffer(64)
    held_stream, fault_stream = backend.create_stream(), backend.create_stream()
    kernels.launch("blocked", held_stream, value=kernels.new_gate())  # never opened
    held = backend.record_event(held_stream)
    notified = threading.Event()
    backend.notify(held_stream, notified.set)
    outcomes: dict[str, object] = {}

    def wait_sync() -> None:
        try:
            backend.synchronize(held_stream)
        except DeviceFault as error:
            outcomes["synchronize"] = error

    def wait_briefly() -> None:
        outcomes["wait_event_for"] = backend.wait_event_for(held, 30.0)

    waiters = [threading.Thread(target=wait_sync), threading.Thread(target=wait_briefly)]
    for waiter in waiters:
        waiter.start()
    kernels.launch("fault", fault_stream)
    with pytest.raises(DeviceFault, match=r"^planted$"):  # the worker's own error, as it was
        backend.synchronize(fault_stream)
    for waiter in waiters:
        waiter.join(10)
    # Pending waits woke, the notification ran, the fault was reported once.
    lost = r"the device worker for device 0 \(host\) faulted: planted"
    assert isinstance(outcomes["synchronize"], DeviceFault)
    assert outcomes["wait_event_for"] is True
    assert notified.is_set()
    assert eventually(lambda: len(faults) == 1)
    assert isinstance(faults[0], DeviceFault)
    assert "device worker for device 0 (host) faulted: planted" in faults[0].message
    for call in (
        lambda: backend.allocate_buffer(64),
        lambda: kernels.launch("append", fault_stream, [buffer], 1),
        lambda: backend.record_event(fault_stream),
        lambda: backend.read(buffer, 0, 4, None),
        lambda: backend.synchronize(),
        lambda: backend.event_done(held),
        lambda: backend.notify(held_stream, lambda: None),
        lambda: backend.create_stream(),
    ):
        with pytest.raises(DeviceFault, match=lost):
            call()
    started = time.perf_counter()
    assert backend.wait_event_for(held, 30.0)
    assert time.perf_counter() - started < 5.0
    # Frees and close are no-ops, so the daemon's cleanup runs.
    backend.destroy(buffer)
    backend.destroy_event(held)
    backend.drop_queued(held_stream)
    backend.destroy_stream(held_stream)
    backend.unpin_host(backend.pin_host(memoryview(bytearray(8))))
    assert backend.memory_in_use() == 0
    assert eventually(lambda: backend.reaped)
    assert backend.returncode == EXIT_DEVICE_LOST
    backend.close()
    backend.close()
    assert len(faults) == 1


def test_a_worker_killed_while_idle_is_reported_through_on_fault() -> None:
    faults: list[DeviceFault] = []
    backend = WorkerBackend("host", 3, on_fault=faults.append)
    os.kill(backend.pid, signal.SIGKILL)
    assert eventually(lambda: len(faults) == 1)
    assert faults[0].message == (
        "the device worker for device 3 (host) faulted: it was killed by SIGKILL"
    )
    with pytest.raises(DeviceFault, match="killed by SIGKILL"):
        backend.allocate_buffer(8)
    assert backend.fault is not None and not backend.alive
    backend.close()
    assert backend.returncode == -signal.SIGKILL


@pytest.mark.skipif(cuda_present(), reason="this machine has a GPU")
def test_a_worker_that_cannot_make_its_backend_fails_its_start() -> None:
    before = worker_children()
    with pytest.raises(UnsupportedOperation, match="needs an NVIDIA GPU"):
        WorkerBackend("cuda", 0)  # the worker's own error, with its class
    assert eventually(lambda: worker_children() <= before)


def test_close_is_idempotent_and_later_calls_say_closed(tmp_path: Path) -> None:
    faults: list[DeviceFault] = []
    backend = WorkerBackend("host", 0, on_fault=faults.append)
    buffer = backend.allocate_buffer(16)
    backend.close()
    assert backend.reaped and backend.returncode == 0
    backend.close()
    with pytest.raises(Unavailable, match=r"device worker for device 0 .* is closed"):
        backend.allocate_buffer(16)
    backend.destroy(buffer)
    assert faults == []  # a close is no fault


def test_a_worker_that_does_not_close_in_time_is_killed(tmp_path: Path) -> None:
    backend = WorkerBackend("host", 0, close_timeout=0.3)
    kernels = Kernels(backend, tmp_path)
    stream = backend.create_stream()
    kernels.launch("blocked", stream, value=kernels.new_gate())  # holds the stream 10 s
    backend.record_event(stream)
    started = time.perf_counter()
    backend.close()  # the worker's backend.close() waits for the stream: it is killed
    assert time.perf_counter() - started < 5.0
    assert backend.returncode == -signal.SIGKILL


def test_a_dropped_proxy_kills_its_worker() -> None:
    backend = WorkerBackend("host", 0)
    pid = backend.pid
    del backend
    gc.collect()
    assert eventually(lambda: gone(pid))  # killed and reaped
