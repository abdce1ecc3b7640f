"""``WorkerBackend`` behaves as the host backend it serves: copies, launches, order, errors."""

from __future__ import annotations

import inspect
import mmap
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from accyd.backends.base import (
    ArtifactRequest,
    Backend,
    BackendKind,
    ExportKind,
    LaunchRequest,
)
from accyd.backends.worker.front.proxy import WorkerBackend
from accyd.catalog import ArtifactFormat, Scalar, load_catalog
from accyd.errors import (
    FailedPrecondition,
    LaunchArgumentMismatch,
    LaunchFailed,
    OutOfMemory,
    RuntimeUnavailable,
    UnsupportedOperation,
)
from tests.pipeline_harness import CASES, run_case
from tests.worker_backend.conftest import ONE, Kernels

CATALOG = load_catalog()


def log_values(backend: Backend, log: object, count: int) -> list[int]:
    raw = backend.read(log, 0, 4 * (count + 1), None)  # type: ignore[arg-type]
    values = np.frombuffer(raw, dtype=np.uint32)
    return [int(v) for v in values[1 : 1 + int(values[0])]]


def test_implements_every_backend_operation_with_its_signature(shared: WorkerBackend) -> None:
    typed: Backend = shared
    assert isinstance(typed, Backend)
    for name in dir(Backend):
        declared = getattr(Backend, name)
        if name.startswith("_") or isinstance(declared, property):
            continue
        theirs = inspect.signature(getattr(WorkerBackend, name))
        assert list(theirs.parameters) == list(inspect.signature(declared).parameters), name
    assert shared.kind is BackendKind.HOST  # the worker's kind, so the daemon behaves the same
    assert shared.formats == frozenset({ArtifactFormat.HOST_PY})
    assert shared.device_name == "host (numpy)"


def test_write_read_round_trip_bounds_and_accounting(shared: WorkerBackend) -> None:
    before = shared.memory_in_use()
    buffer = shared.allocate_buffer(64)
    assert buffer.address % 256 == 0 and buffer.address != 0  # the worker's real address
    assert shared.memory_in_use() == before + 64
    data = np.arange(16, dtype=np.float32)
    shared.write(buffer, 0, data.tobytes(), None)
    shared.write(buffer, 60, b"\x01\x02\x03\x04", None)
    got = np.frombuffer(shared.read(buffer, 0, 64, None), dtype=np.float32)
    assert np.array_equal(got[:15], data[:15])
    assert shared.read(buffer, 60, 4, None) == b"\x01\x02\x03\x04"
    with pytest.raises(LaunchArgumentMismatch, match="outside the buffer's 64"):
        shared.write(buffer, 62, b"\x00" * 4, None)
    with pytest.raises(LaunchArgumentMismatch, match="outside"):
        shared.read(buffer, 0, 65, None)
    staging = bytearray(8)
    shared.read_into(buffer, 60, memoryview(staging)[4:], None)
    assert staging == b"\x00" * 4 + b"\x01\x02\x03\x04"
    with pytest.raises(LaunchArgumentMismatch, match="writable"):
        shared.read_into(buffer, 0, memoryview(b"read-only"), None)
    shared.destroy(buffer)
    shared.destroy(buffer)  # a second destroy does nothing
    assert shared.memory_in_use() == before
    with pytest.raises(LaunchArgumentMismatch, match="not allocated"):
        shared.read(buffer, 0, 4, None)


def test_copies_larger_than_a_frame_arrive_whole(shared: WorkerBackend) -> None:
    size = 3 * (1 << 20) + 12345  # four frames, the last one partial
    data = np.random.default_rng(3).integers(0, 256, size, dtype=np.uint8)
    buffer = shared.allocate_buffer(size, zero=True)
    stream = shared.create_stream()
    shared.write(buffer, 0, memoryview(data.reshape(3, -1)), stream)  # 2-D: cast to bytes
    assert shared.read(buffer, 0, size, stream) == data.tobytes()
    for part in (0, 1000, 600_000):  # nothing, within one read-ahead, one frame of its own
        got = shared.read(buffer, 5, part, stream)
        assert type(got) is bytes and got == data[5 : 5 + part].tobytes()
    shared.write(buffer, 0, b"", stream)
    out = np.zeros(size - 7, dtype=np.uint8)
    shared.read_into(buffer, 7, out, stream)
    assert np.array_equal(out, data[7:])
    shared.destroy(buffer)
    shared.destroy_stream(stream)


def test_out_of_memory_is_raised_as_itself_and_frees_come_first(shared: WorkerBackend) -> None:
    with pytest.raises(OutOfMemory, match="memory limit of 67108864"):
        shared.allocate_buffer(128 << 20)
    # 40 MiB twice passes the 64 MiB limit unless the first is freed before the second is
    # allocated: the free is one-way, the allocation a round trip sent after it.
    for _ in range(3):
        shared.destroy(shared.allocate_buffer(40 << 20, zero=True))
    assert shared.memory_in_use() == 0


@pytest.mark.parametrize("target", sorted(CASES))
@pytest.mark.parametrize("pooled", [False, True], ids=["owned", "pooled"])
def test_builtin_pipelines_through_the_worker_match_float64(
    shared: WorkerBackend, target: str, pooled: bool
) -> None:
    for n in (1, 4097, 300_001):
        error = run_case(
            shared,
            CATALOG,
            ArtifactFormat.HOST_PY,
            CASES[target],
            n,
            seed=n + pooled,
            pooled=pooled,
        )
        assert error < CASES[target].tolerance
    assert shared.memory_in_use() == 0


def test_launches_keep_stream_order_across_batches(shared: WorkerBackend, kernels: Kernels) -> None:
    stream = shared.create_stream()
    log = shared.allocate_buffer(4 * 301, zero=True)
    gate = kernels.new_gate()
    kernels.launch("blocked", stream, value=gate)
    for value in range(100):
        kernels.launch("append", stream, [log], value)  # batched: no frame yet
    event = shared.record_event(stream)  # the flush
    assert not shared.event_done(event)  # the stream is held by the blocked kernel
    started = time.perf_counter()
    assert not shared.wait_event_for(event, 0.05)
    assert time.perf_counter() - started >= 0.045
    for value in range(100, 300):  # more batches, some behind events
        kernels.launch("append", stream, [log], value)
        if value % 50 == 0:
            shared.destroy_event(shared.record_event(stream))
    kernels.open(gate)
    assert shared.wait_event_for(event, 10.0)
    assert shared.event_done(event)
    shared.synchronize(stream)
    assert log_values(shared, log, 300) == list(range(300))
    shared.destroy_event(event)
    shared.destroy(log)
    shared.destroy_stream(stream)


def test_many_threads_each_keep_their_streams_order(
    shared: WorkerBackend, kernels: Kernels
) -> None:
    def submit(log: object, stream: object) -> None:
        for value in range(200):
            kernels.launch("append", stream, [log], value)  # type: ignore[list-item, arg-type]
            if value % 7 == 0:
                shared.destroy_event(shared.record_event(stream))  # type: ignore[arg-type]

    streams = [shared.create_stream() for _ in range(4)]
    logs = [shared.allocate_buffer(4 * 201, zero=True) for _ in streams]
    threads = [
        threading.Thread(target=submit, args=(log, stream))
        for log, stream in zip(logs, streams, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    shared.synchronize()  # the whole device; also flushes what is still batched
    for log in logs:
        assert log_values(shared, log, 200) == list(range(200))
        shared.destroy(log)
    for stream in streams:
        shared.destroy_stream(stream)


def test_wait_event_orders_work_across_streams(shared: WorkerBackend, kernels: Kernels) -> None:
    first, second = shared.create_stream(), shared.create_stream()
    log = shared.allocate_buffer(4 * 3, zero=True)
    gate = kernels.new_gate()
    kernels.launch("blocked", first, value=gate)
    kernels.launch("append", first, [log], 1)
    written = shared.record_event(first)
    shared.wait_event(second, written)
    kernels.launch("append", second, [log], 2)
    threading.Timer(0.05, kernels.open, (gate,)).start()
    shared.synchronize(second)
    assert log_values(shared, log, 2) == [1, 2]
    shared.destroy(log)


def test_notifications_run_once_their_work_is_over(shared: WorkerBackend, kernels: Kernels) -> None:
    stream = shared.create_stream()
    log = shared.allocate_buffer(4 * 3, zero=True)
    kernels.launch("append", stream, [log], 1)
    early = shared.record_event(stream)
    gate = kernels.new_gate()
    kernels.launch("blocked", stream, value=gate)
    late = shared.record_event(stream)
    called: list[str] = []
    reached = threading.Event()
    shared.notify_event(late, stream, lambda: called.append("late"))
    shared.notify_event(early, stream, lambda: (called.append("early"), reached.set()))
    assert reached.wait(5)
    assert called == ["early"]  # while the blocked kernel still holds the stream
    assert shared.event_done(early) and not shared.event_done(late)
    shared.notify_event(early, stream, lambda: called.append("again"))  # known over: at once
    assert called == ["early", "again"]
    stream_done = threading.Event()
    shared.notify(stream, stream_done.set)
    kernels.open(gate)
    assert stream_done.wait(5)
    shared.synchronize(stream)
    assert called == ["early", "again", "late"]
    assert shared.event_done(late)


def test_errors_of_one_way_ops_come_with_the_next_wait_on_their_stream(
    shared: WorkerBackend, kernels: Kernels
) -> None:
    stream, other = shared.create_stream(), shared.create_stream()
    log = shared.allocate_buffer(4 * 3, zero=True)
    freed = shared.allocate_buffer(8)
    shared.destroy(freed)
    before = shared.record_event(stream)
    kernels.launch("append", stream, [freed], 1)  # refused by the worker, not raised here
    after = shared.record_event(stream)
    kernels.launch("append", stream, [log], 5)
    kernels.launch("append", other, [log], 6)
    shared.synchronize(other)  # another stream's wait does not see it
    shared.synchronize_event(before)  # nor an event recorded before the failure
    # Failed work counts as over; the front learns it from a notification, not a round trip.
    deadline = time.monotonic() + 5
    while not shared.event_done(after) and time.monotonic() < deadline:
        time.sleep(0.001)
    assert shared.event_done(after)
    with pytest.raises(LaunchFailed, match=rf"buffers \[{freed.id}\] are not allocated"):
        shared.synchronize_event(after)
    shared.synchronize(stream)  # reported once
    assert sorted(log_values(shared, log, 2)) == [5, 6]
    kernels.launch("boom", stream)  # a kernel that fails in the worker's stream
    with pytest.raises(LaunchFailed, match="ZeroDivisionError: planted"):
        shared.synchronize(stream)
    kernels.launch("append", stream, [freed], 1)
    with pytest.raises(LaunchFailed, match="not allocated"):
        shared.read(log, 0, 8, stream)  # a copy on the stream waits for it too
    kernels.launch("append", stream, [freed], 1)  # kept by the worker...
    kernels.launch("boom", stream)  # ...while the stream's own wait fails: that comes first
    with pytest.raises(LaunchFailed, match="ZeroDivisionError"):
        shared.synchronize(stream)
    with pytest.raises(LaunchFailed, match="not allocated"):
        shared.synchronize()  # the whole device's wait covers the stream
    shared.synchronize(stream)
    shared.destroy(log)


def test_prepared_launches_replay_in_order_with_plain_launches(
    shared: WorkerBackend, kernels: Kernels
) -> None:
    stream = shared.create_stream()
    log = shared.allocate_buffer(4 * 37, zero=True)
    prepared = shared.prepare(
        [
            LaunchRequest(None, kernels.loaded["append"], [log], [Scalar.u32(7)], ONE, stream),
            LaunchRequest(None, kernels.loaded["append"], [log], [Scalar.u32(8)], ONE, stream),
        ]
    )
    for value in range(10):
        prepared.launch(stream)
        kernels.launch("append", stream, [log], value)
    prepared.launch(stream, 3)  # three replays in one op
    shared.synchronize(stream)
    expected = [v for value in range(10) for v in (7, 8, value)] + [7, 8] * 3
    assert log_values(shared, log, 36) == expected
    prepared.close()
    prepared.close()
    with pytest.raises(LaunchFailed, match="closed"):
        prepared.launch(stream)
    shared.destroy(log)


def test_drop_queued_skips_kernels_not_started_but_ends_events(
    shared: WorkerBackend, kernels: Kernels
) -> None:
    stream = shared.create_stream()
    log = shared.allocate_buffer(4 * 11, zero=True)
    gate = kernels.new_gate()
    kernels.launch("blocked", stream, value=gate)
    for value in range(10):
        kernels.launch("append", stream, [log], value)
    event = shared.record_event(stream)
    shared.drop_queued(stream)
    kernels.open(gate)
    shared.synchronize_event(event)
    assert np.frombuffer(shared.read(log, 0, 4, None), dtype=np.uint32)[0] == 0
    shared.destroy(log)


def test_artifact_errors_keep_their_types(shared: WorkerBackend) -> None:
    with pytest.raises(RuntimeUnavailable, match=r"invalid syntax|expected"):
        shared.create_artifact(ArtifactRequest("f", ArtifactFormat.HOST_PY, 1, 0, "def f(:\n"))
    missing = shared.create_artifact(ArtifactRequest("missing", ArtifactFormat.HOST_PY, 0, 0, ""))
    with pytest.raises(FailedPrecondition, match="entry 'missing' names no function") as caught:
        shared.load_artifact(missing)
    assert caught.value.field == "entry"  # the error's fields cross too
    missing.close()
    with pytest.raises(RuntimeUnavailable, match="the artifact is closed"):
        shared.load_artifact(missing)
    with pytest.raises(UnsupportedOperation, match="not cuda_cpp"):
        shared.create_artifact(ArtifactRequest("f", ArtifactFormat.CUDA_CPP, 1, 0, "__global__"))


def test_polling_many_events_registers_one_notification_per_stream_at_a_time(
    shared: WorkerBackend, kernels: Kernels, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = shared.create_stream()
    gate = kernels.new_gate()
    kernels.launch("blocked", stream, value=gate)
    events = [shared.record_event(stream) for _ in range(40)]
    registered: list[int] = []
    notify = shared._streams._notify_event

    def counting(eid: int, state: Any, callback: Callable[[], None]) -> None:
        registered.append(eid)
        notify(eid, state, callback)

    monkeypatch.setattr(shared._streams, "_notify_event", counting)
    for _ in range(3):  # polled again and again, as a session's reap does
        assert not any(shared.event_done(event) for event in events)
    assert registered == [events[-1].id]  # the newest covers every older one
    kernels.open(gate)
    deadline = time.monotonic() + 5
    while not shared.event_done(events[0]) and time.monotonic() < deadline:
        time.sleep(0.001)
    assert all(shared.event_done(event) for event in events)  # known here, no more asks
    assert registered == [events[-1].id]
    for event in events:
        shared.destroy_event(event)


def test_a_notification_for_a_destroyed_event_waits_for_its_stream(
    shared: WorkerBackend, kernels: Kernels
) -> None:
    stream = shared.create_stream()
    gate = kernels.new_gate()
    kernels.launch("blocked", stream, value=gate)
    event = shared.record_event(stream)
    state = event.native
    shared.destroy_event(event)  # the worker forgets it before the notification comes
    reached = threading.Event()
    shared._streams._notify_event(event.id, state, reached.set)
    assert not reached.wait(0.2)  # never claimed over while the stream still runs
    assert not shared.event_done(event)
    kernels.open(gate)
    assert reached.wait(5)
    assert shared.event_done(event)


def test_an_exportable_buffer_is_handed_over_from_the_worker(shared: WorkerBackend) -> None:
    buffer = shared.allocate_buffer(5000, zero=True, exportable=True)
    data = np.arange(1250, dtype=np.float32)
    shared.write(buffer, 0, data.tobytes(), None)
    exported = shared.export_buffer(buffer)
    try:
        assert exported.kind is ExportKind.HOST_MEMFD
        assert (exported.offset, exported.mapping_size) == (0, mmap.PAGESIZE * 2)
        with mmap.mmap(exported.fd, exported.mapping_size) as mapped:
            view = np.frombuffer(mapped, dtype=np.float32, count=1250)
            np.testing.assert_array_equal(view, data)  # the worker's own pages
            mapped[:4] = np.float32(-1).tobytes()
            del view
    finally:
        os.close(exported.fd)
    assert np.frombuffer(shared.read(buffer, 0, 4, None), np.float32)[0] == -1
    plain = shared.allocate_buffer(64)
    with pytest.raises(FailedPrecondition, match="not allocated exportable"):
        shared.export_buffer(plain)
    shared.destroy(plain)
    shared.destroy(buffer)


def test_sm_partitions_and_priorities_reach_the_worker(shared: WorkerBackend) -> None:
    from accyd.backends.partitions import PartitionSpec

    split = shared.split_sms([PartitionSpec("batch", sms=64)])
    assert split.partitions == () and "CPU threads" in split.unconfined  # the host's answer
    stream = shared.create_stream(None, 3)  # a priority the host backend ignores
    assert stream.partition is None
    shared.destroy_stream(stream)
    with pytest.raises(UnsupportedOperation, match="no SM partition 'batch'"):
        shared.create_stream("batch", 0)
