"""The host backend: aligned buffers, ordered asynchronous streams, events, errors and cleanup."""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from accyd.backends.base import ArtifactRequest, Backend, BackendKind, LaunchRequest
from accyd.backends.host import HostBackend
from accyd.catalog import ArtifactFormat, Scalar
from accyd.catalog.model import FixedGeometry
from accyd.errors import (
    DeviceFault,
    FailedPrecondition,
    LaunchArgumentMismatch,
    LaunchFailed,
    OutOfMemory,
    RuntimeUnavailable,
    UnsupportedOperation,
)
from accyd.testing import RecordingBackend

KERNELS = """
import threading
import time
gate = threading.Event()

def append(grid, block, buffers, scalars):
    # Writes scalars[0] at the next free slot: the order of launches shows in the buffer.
    view = buffers[0].view("uint32")
    count = int(view[0])
    view[count + 1] = int(scalars[0])
    view[0] = count + 1

def blocked(grid, block, buffers, scalars):
    gate.wait(10)

def boom(grid, block, buffers, scalars):
    raise ZeroDivisionError("planted")

ran_on = []

def where(grid, block, buffers, scalars):
    # Naps scalars[0] ms and notes (its scalar, the thread it ran on).
    if scalars[0]:
        time.sleep(int(scalars[0]) / 1000)
    ran_on.append((int(scalars[0]), threading.current_thread().name))
"""

ONE = FixedGeometry((1, 1, 1), (1, 1, 1))


@pytest.fixture
def backend() -> Iterator[HostBackend]:
    backend = HostBackend(memory_limit=1 << 30)
    yield backend
    backend.close()


def kernel(backend: HostBackend, name: str):  # type: ignore[no-untyped-def]
    request = ArtifactRequest(name, ArtifactFormat.HOST_PY, 2, 1, KERNELS, origin="test")
    artifact = backend.create_artifact(request)
    loaded = backend.load_artifact(artifact)
    return artifact, loaded


def test_implements_every_backend_operation_with_its_signature(backend: HostBackend) -> None:
    typed: Backend = backend  # mypy checks the whole protocol here
    operations = [
        name for name in dir(Backend) if not name.startswith("_") and name not in ("kind",)
    ]
    for implementation in (typed, RecordingBackend()):
        for name in operations:
            declared = getattr(Backend, name)
            if isinstance(declared, property):
                continue
            theirs = inspect.signature(getattr(type(implementation), name))
            assert list(theirs.parameters) == list(inspect.signature(declared).parameters), name
    assert backend.kind is BackendKind.HOST
    assert backend.formats == frozenset({ArtifactFormat.HOST_PY})


def test_buffers_are_256_byte_aligned_and_accounted(backend: HostBackend) -> None:
    buffers = [backend.allocate_buffer(size) for size in (1, 255, 4097)]
    assert all(b.address % 256 == 0 for b in buffers)
    assert backend.memory_in_use() == 1 + 255 + 4097
    for buffer in buffers:
        backend.destroy(buffer)
    assert backend.memory_in_use() == 0


def test_write_read_round_trip_and_bounds(backend: HostBackend) -> None:
    buffer = backend.allocate_buffer(64)
    data = np.arange(16, dtype=np.float32)
    backend.write(buffer, 0, data.tobytes(), None)
    backend.write(buffer, 60, b"\x01\x02\x03\x04", None)
    got = np.frombuffer(backend.read(buffer, 0, 64, None), dtype=np.float32)
    assert np.array_equal(got[:15], data[:15])
    assert backend.read(buffer, 60, 4, None) == b"\x01\x02\x03\x04"
    with pytest.raises(LaunchArgumentMismatch, match="outside the buffer's 64"):
        backend.write(buffer, 62, b"\x00" * 4, None)
    with pytest.raises(LaunchArgumentMismatch, match="outside"):
        backend.read(buffer, 0, 65, None)
    staging = bytearray(8)
    backend.read_into(buffer, 60, memoryview(staging)[4:], None)  # into part of a buffer
    assert staging == b"\x00" * 4 + b"\x01\x02\x03\x04"
    with pytest.raises(LaunchArgumentMismatch, match="writable"):
        backend.read_into(buffer, 0, memoryview(b"read-only"), None)
    with pytest.raises(LaunchArgumentMismatch, match="outside"):
        backend.read_into(buffer, 60, bytearray(8), None)
    backend.destroy(buffer)
    with pytest.raises(LaunchArgumentMismatch, match="not allocated"):
        backend.read(buffer, 0, 4, None)


def test_memory_limit_gives_out_of_memory_and_the_backend_keeps_working(
    backend: HostBackend,
) -> None:
    with pytest.raises(OutOfMemory, match="limit"):
        backend.allocate_buffer(2 << 30)
    assert backend.memory_in_use() == 0
    backend.destroy(backend.allocate_buffer(1024))


def test_launches_run_in_order_on_one_stream_and_asynchronously(backend: HostBackend) -> None:
    _, append = kernel(backend, "append")
    _, blocked = kernel(backend, "blocked")
    stream = backend.create_stream()
    log = backend.allocate_buffer(4 * 101)
    backend.write(log, 0, bytes(4 * 101), stream)
    backend.launch(LaunchRequest(None, blocked, [log], [Scalar.u32(0)], ONE, stream))
    for value in range(100):
        backend.launch(LaunchRequest(None, append, [log], [Scalar.u32(value)], ONE, stream))
    event = backend.record_event(stream)
    assert not backend.event_done(event)  # the stream is held by the blocked kernel
    started = time.perf_counter()
    assert not backend.wait_event_for(event, 0.05)
    assert time.perf_counter() - started >= 0.045
    blocked.native.__globals__["gate"].set()
    assert backend.wait_event_for(event, 10.0)
    backend.synchronize(stream)
    assert backend.event_done(event)
    got = np.frombuffer(backend.read(log, 0, 4 * 101, stream), dtype=np.uint32)
    assert got[0] == 100
    assert list(got[1:]) == list(range(100))
    backend.destroy_event(event)
    backend.destroy_stream(stream)


def test_a_short_kernel_on_an_idle_stream_runs_on_the_launching_thread_in_order(
    backend: HostBackend,
) -> None:
    """Handing a kernel to the stream's thread costs two wake-ups; one known to be quicker
    than that runs on the caller's thread, but only with nothing before it on the stream."""
    _, where = kernel(backend, "where")
    _, blocked = kernel(backend, "blocked")
    ran_on = where.native.__globals__["ran_on"]
    stream = backend.create_stream()
    log = backend.allocate_buffer(4)
    me = threading.current_thread().name

    def launch(loaded, value: int) -> None:  # type: ignore[no-untyped-def]
        backend.launch(LaunchRequest(None, loaded, [log], [Scalar.u32(value)], ONE, stream))

    launch(where, 0)  # not yet known to be short: the stream's thread
    backend.synchronize(stream)
    assert ran_on[0] == (0, f"accy-host-stream-{stream.id}")
    for _ in range(50):  # known short (unless a busy machine stretched the last run)
        launch(where, 0)
        if ran_on[-1] == (0, me):  # the stream idle: here, before launch returned
            break
        backend.synchronize(stream)
    else:
        pytest.fail(f"a short kernel never ran on the launching thread: {ran_on[-3:]}")
    del ran_on[1:-1]
    assert backend.event_done(backend.record_event(stream))  # a fence on an idle stream too
    launch(where, 3)  # other scalars: not known, so not here
    backend.synchronize(stream)
    launch(where, 3)  # it took 3 ms: never here
    backend.synchronize(stream)
    assert [thread == me for value, thread in ran_on[2:]] == [False, False]
    launch(blocked, 0)
    launch(where, 0)  # short, but the stream is busy: it waits its turn on the stream
    assert len(ran_on) == 4
    blocked.native.__globals__["gate"].set()
    backend.synchronize(stream)
    assert ran_on[-1][0] == 0 and ran_on[-1][1] != me


def test_notify_event_calls_back_once_the_work_before_the_event_is_over(
    backend: HostBackend,
) -> None:
    _, append = kernel(backend, "append")
    _, blocked = kernel(backend, "blocked")
    stream = backend.create_stream()
    log = backend.allocate_buffer(4 * 3)
    backend.write(log, 0, bytes(12), stream)
    backend.launch(LaunchRequest(None, append, [log], [Scalar.u32(1)], ONE, stream))
    early = backend.record_event(stream)
    backend.launch(LaunchRequest(None, blocked, [log], [Scalar.u32(0)], ONE, stream))
    late = backend.record_event(stream)
    called: list[str] = []
    reached = threading.Event()
    backend.notify_event(late, stream, lambda: called.append("late"))
    backend.notify_event(early, stream, lambda: (called.append("early"), reached.set()))
    assert reached.wait(5)
    assert called == ["early"]  # while the blocked kernel still holds the stream
    backend.notify_event(early, stream, lambda: called.append("again"))  # reached: at once
    assert called == ["early", "again"]
    blocked.native.__globals__["gate"].set()
    backend.synchronize(stream)
    assert called == ["early", "again", "late"]


def test_drop_queued_skips_kernels_not_started_but_ends_events(backend: HostBackend) -> None:
    _, append = kernel(backend, "append")
    _, blocked = kernel(backend, "blocked")
    stream = backend.create_stream()
    log = backend.allocate_buffer(4 * 11)
    backend.write(log, 0, bytes(44), stream)
    backend.launch(LaunchRequest(None, blocked, [log], [Scalar.u32(0)], ONE, stream))
    for value in range(10):
        backend.launch(LaunchRequest(None, append, [log], [Scalar.u32(value)], ONE, stream))
    event = backend.record_event(stream)
    backend.drop_queued(stream)
    blocked.native.__globals__["gate"].set()
    backend.synchronize_event(event)
    assert backend.event_done(event)
    assert np.frombuffer(backend.read(log, 0, 4, stream), dtype=np.uint32)[0] == 0


def test_a_failing_notification_leaves_its_stream_healthy(backend: HostBackend) -> None:
    stream = backend.create_stream()
    event = backend.record_event(stream)

    def broken() -> None:
        raise RuntimeError("a waiter's bug")

    backend.notify(stream, broken)
    backend.synchronize_event(event)
    backend.notify_event(event, stream, broken)
    backend.synchronize(stream)  # raises nothing: the stream's work did not fail


def test_wait_event_orders_work_across_streams(backend: HostBackend) -> None:
    _, append = kernel(backend, "append")
    _, blocked = kernel(backend, "blocked")
    first, second = backend.create_stream(), backend.create_stream()
    log = backend.allocate_buffer(4 * 3)
    backend.write(log, 0, bytes(12), first)
    backend.launch(LaunchRequest(None, blocked, [log], [Scalar.u32(0)], ONE, first))
    backend.launch(LaunchRequest(None, append, [log], [Scalar.u32(1)], ONE, first))
    written = backend.record_event(first)
    backend.wait_event(second, written)
    backend.launch(LaunchRequest(None, append, [log], [Scalar.u32(2)], ONE, second))
    threading.Timer(0.05, blocked.native.__globals__["gate"].set).start()
    backend.synchronize(second)
    got = np.frombuffer(backend.read(log, 0, 12, second), dtype=np.uint32)
    assert list(got) == [2, 1, 2]


def test_a_failing_kernel_fails_its_stream_once_and_nothing_else(backend: HostBackend) -> None:
    _, boom = kernel(backend, "boom")
    _, append = kernel(backend, "append")
    bad, good = backend.create_stream(), backend.create_stream()
    log = backend.allocate_buffer(8)
    backend.write(log, 0, bytes(8), good)
    backend.launch(LaunchRequest(None, boom, [log], [Scalar.u32(0)], ONE, bad))
    backend.launch(LaunchRequest(None, append, [log], [Scalar.u32(7)], ONE, good))
    backend.synchronize(good)
    with pytest.raises(LaunchFailed, match="ZeroDivisionError: planted"):
        backend.synchronize(bad)
    backend.synchronize(bad)  # reported once, then the stream is usable again
    assert np.frombuffer(backend.read(log, 0, 8, good), dtype=np.uint32).tolist() == [1, 7]


def test_artifact_errors_are_runtime_unavailable(backend: HostBackend) -> None:
    with pytest.raises(RuntimeUnavailable, match=r"invalid syntax|expected"):
        backend.create_artifact(ArtifactRequest("f", ArtifactFormat.HOST_PY, 1, 0, "def f(:\n"))
    # A manifest naming no function: not retryable (UNAVAILABLE would be retried).
    with pytest.raises(FailedPrecondition, match="entry 'missing' names no function"):
        kernel(backend, "missing")
    with pytest.raises(UnsupportedOperation, match="not cuda_cpp"):
        backend.create_artifact(ArtifactRequest("f", ArtifactFormat.CUDA_CPP, 1, 0, "__global__"))


def test_launch_of_an_unloaded_kernel_or_freed_buffer_fails(backend: HostBackend) -> None:
    _, append = kernel(backend, "append")
    log = backend.allocate_buffer(8)
    backend.destroy(log)
    with pytest.raises(LaunchFailed, match="not allocated"):
        backend.launch(LaunchRequest(None, append, [log], [Scalar.u32(1)], ONE, None))
    backend.destroy(append)
    with pytest.raises(LaunchFailed, match="not loaded"):
        backend.launch(LaunchRequest(None, append, [], [Scalar.u32(1)], ONE, None))


def test_close_is_idempotent_and_frees_everything() -> None:
    backend = HostBackend()
    backend.allocate_buffer(1 << 20)
    backend.create_stream()
    backend.close()
    assert backend.memory_in_use() == 0
    backend.close()


def test_a_device_fault_poisons_the_backend_until_a_new_one_is_made(backend: HostBackend) -> None:
    fault = ArtifactRequest(
        "fault",
        ArtifactFormat.HOST_PY,
        0,
        0,
        "from accyd.errors import DeviceFault\n"
        "def fault(grid, block, buffers, scalars):\n    raise DeviceFault('planted')\n",
    )
    loaded = backend.load_artifact(backend.create_artifact(fault))
    buffer = backend.allocate_buffer(64)
    stream, other = backend.create_stream(), backend.create_stream()
    backend.launch(LaunchRequest(None, loaded, [], [], ONE, stream))
    with pytest.raises(DeviceFault, match="planted"):
        backend.synchronize(stream)
    for call in (
        lambda: backend.synchronize(other),
        lambda: backend.allocate_buffer(64),
        lambda: backend.read(buffer, 0, 4, other),
        lambda: backend.launch(LaunchRequest(None, loaded, [], [], ONE, other)),
    ):
        with pytest.raises(DeviceFault, match="lost earlier: planted"):
            call()
    backend.destroy(buffer)  # freeing still works, so cleanup can run
    assert backend.memory_in_use() == 0


def test_synchronize_event_reports_the_error_of_the_work_before_it_once(
    backend: HostBackend,
) -> None:
    _, boom = kernel(backend, "boom")
    _, append = kernel(backend, "append")
    stream = backend.create_stream()
    log = backend.allocate_buffer(8)
    backend.write(log, 0, bytes(8), stream)
    before = backend.record_event(stream)
    backend.launch(LaunchRequest(None, boom, [log], [Scalar.u32(0)], ONE, stream))
    after = backend.record_event(stream)
    backend.launch(LaunchRequest(None, append, [log], [Scalar.u32(5)], ONE, stream))
    backend.synchronize_event(before)  # the failure came later: not this event's
    with pytest.raises(LaunchFailed, match="ZeroDivisionError: planted"):
        backend.synchronize_event(after)
    backend.synchronize(stream)  # reported once, not again at the next sync
    assert np.frombuffer(backend.read(log, 0, 8, stream), dtype=np.uint32).tolist() == [1, 5]


def test_zeroed_buffers_never_show_earlier_data(backend: HostBackend) -> None:
    for _ in range(20):
        old = backend.allocate_buffer(4096)
        backend.write(old, 0, b"\xff" * 4096, None)
        backend.destroy(old)
        fresh = backend.allocate_buffer(4096, zero=True)
        assert backend.read(fresh, 0, 4096, None) == bytes(4096)
        backend.destroy(fresh)
