"""Host-shared memory through a worker: it maps the segment's memfd, so copies carry no bytes."""

from __future__ import annotations

import fcntl
import mmap
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from structlog.testing import capture_logs

from accyd.backends.worker.front.pins import PinnedRange, address_of, file_identity, maps_file
from accyd.backends.worker.front.proxy import WorkerBackend
from accyd.backends.worker.protocol import Op
from accyd.errors import DeviceFault
from tests.worker_backend.conftest import Kernels, traffic

SIZE = 4 << 20
PART = 1 << 20
NAME = "accy-pin-test"


class Segment:
    """A segment as ``HostSegment`` makes one: a sealed memfd, mapped whole in this process."""

    def __init__(self, size: int = SIZE) -> None:
        self.fd = os.memfd_create(NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, size)
        seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, seals)
        self.map = mmap.mmap(self.fd, size)
        self.view = memoryview(self.map)
        self.array = np.frombuffer(self.map, np.uint8)

    def close(self) -> None:
        del self.array
        self.view.release()
        self.map.close()
        os.close(self.fd)


@pytest.fixture
def segment() -> Iterator[Segment]:
    made = Segment()
    yield made
    made.close()


def mapped_in(pid: int) -> int:
    """Mappings of test segments in process ``pid``."""
    return Path(f"/proc/{pid}/maps").read_text().count(NAME)


def pattern(seed: int, size: int = PART) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def test_copies_inside_a_pinned_segment_carry_no_bytes(
    shared: WorkerBackend, segment: Segment
) -> None:
    before = mapped_in(shared.pid)
    pinned = shared.pin_host(segment.view, fd=segment.fd)
    assert isinstance(pinned, PinnedRange)
    assert mapped_in(shared.pid) == before + 1  # the worker mapped the same file
    buffer = shared.allocate_buffer(3 * PART)
    stream = shared.create_stream()
    first, second = pattern(1), pattern(2)
    segment.array[:PART] = first
    segment.array[SIZE - PART :] = second
    try:
        with traffic(shared) as moved:
            shared.write(buffer, 0, segment.view[:PART], stream)
            # A typed view (what a shared_array is), from the segment's last bytes.
            floats = np.frombuffer(segment.map, np.float32, PART // 4, SIZE - PART)
            shared.write(buffer, PART, floats, None)
            del floats
            shared.read_into(buffer, 0, segment.view[PART : 2 * PART], stream)
            shared.read_into(buffer, PART + 8, segment.view[2 * PART : 3 * PART - 8], None)
        assert moved.calls == [Op.WRITE_SHARED, Op.WRITE_SHARED, Op.READ_SHARED, Op.READ_SHARED]
        assert moved.sent < 2048 and moved.received == 0  # four small ops, no payload
        np.testing.assert_array_equal(segment.array[PART : 2 * PART], first)
        np.testing.assert_array_equal(segment.array[2 * PART : 3 * PART - 8], second[8:])
        # The bytes path agrees on what the buffer holds.
        assert shared.read(buffer, 0, 2 * PART, None) == first.tobytes() + second.tobytes()
    finally:
        shared.unpin_host(pinned)
        shared.destroy(buffer)
        shared.destroy_stream(stream)
    assert mapped_in(shared.pid) == before  # unpinned and unmapped in the worker


def test_a_shared_copy_keeps_its_streams_order(
    shared: WorkerBackend, kernels: Kernels, segment: Segment
) -> None:
    pinned = shared.pin_host(segment.view, fd=segment.fd)
    buffer = shared.allocate_buffer(64)
    stream = shared.create_stream()
    out = segment.array[:64].view(np.uint32)
    try:
        shared.write(buffer, 0, bytes(64), stream)
        gate = kernels.new_gate()
        kernels.launch("blocked", stream, value=gate)
        kernels.launch("append", stream, [buffer], 7)
        done = threading.Event()
        reader = threading.Thread(
            target=lambda: (shared.read_into(buffer, 0, segment.view[:64], stream), done.set())
        )
        reader.start()
        assert not done.wait(0.3)  # held behind the blocked kernel, as its stream orders it
        kernels.open(gate)
        reader.join(10)
        assert done.is_set()
        assert list(out[:2]) == [1, 7]  # it ran after the append, into the shared pages
    finally:
        del out
        shared.unpin_host(pinned)
        shared.destroy(buffer)
        shared.destroy_stream(stream)


def test_memory_outside_every_pinned_range_carries_its_bytes(
    shared: WorkerBackend, segment: Segment
) -> None:
    pinned = shared.pin_host(segment.view, fd=segment.fd)
    other = Segment(PART)  # a segment nobody pinned
    buffer = shared.allocate_buffer(PART)
    data = pattern(3)
    try:
        with traffic(shared) as moved:
            shared.write(buffer, 0, memoryview(bytearray(data.tobytes())), None)
            shared.read_into(buffer, 0, other.view, None)
        assert moved.calls == [Op.WRITE, Op.READ]
        assert moved.sent >= PART and moved.received == PART
        np.testing.assert_array_equal(other.array, data)
    finally:
        shared.unpin_host(pinned)
        shared.destroy(buffer)
        other.close()


def test_after_unpin_copies_carry_bytes_and_stay_right(
    shared: WorkerBackend, segment: Segment
) -> None:
    before = mapped_in(shared.pid)
    pinned = shared.pin_host(segment.view, fd=segment.fd)
    shared.unpin_host(pinned)
    shared.unpin_host(pinned)  # a second unpin does nothing
    assert mapped_in(shared.pid) == before
    buffer = shared.allocate_buffer(PART)
    segment.array[:PART] = pattern(4)
    try:
        with traffic(shared) as moved:
            shared.write(buffer, 0, segment.view[:PART], None)
            shared.read_into(buffer, 0, segment.view[PART : 2 * PART], None)
        assert moved.calls == [Op.WRITE, Op.READ]
        assert moved.sent >= PART and moved.received == PART
        np.testing.assert_array_equal(segment.array[PART : 2 * PART], pattern(4))
    finally:
        shared.destroy(buffer)


def test_maps_file_knows_a_files_mapping_from_another(segment: Segment) -> None:
    other = Segment(SIZE)
    try:
        base = address_of(segment.view)
        assert maps_file(base, SIZE, file_identity(segment.fd))
        assert not maps_file(base, SIZE, file_identity(other.fd))  # another file
        assert not maps_file(base + 4096, SIZE - 4096, file_identity(segment.fd))  # offset 4096
        assert not maps_file(base, SIZE + 4096, file_identity(segment.fd))  # past its end
        heap = bytearray(4096)
        assert not maps_file(address_of(memoryview(heap)), 4096, file_identity(segment.fd))
    finally:
        other.close()


def test_memory_the_worker_cannot_map_is_copied_as_bytes_and_said_once(
    segment: Segment,
) -> None:
    backend = WorkerBackend("host", 0, host_memory_limit=16 << 20, log_level="warning")
    other = Segment(SIZE)
    try:
        buffer = backend.allocate_buffer(PART)
        with capture_logs() as logs:
            # The wrong descriptor: the front sees it is not this memory's file.
            assert not isinstance(backend.pin_host(segment.view, fd=other.fd), PinnedRange)
            # The right one, but the worker looks in the wrong process: it cannot map it.
            backend._front_pid = backend.pid
            assert not isinstance(backend.pin_host(segment.view, fd=segment.fd), PinnedRange)
        assert mapped_in(backend.pid) == 0
        said = [entry for entry in logs if "copied through" in entry["event"]]
        assert len(said) == 1 and "not descriptor" in said[0]["reason"]
        segment.array[:PART] = pattern(5)
        with traffic(backend) as moved:
            backend.write(buffer, 0, segment.view[:PART], None)
            backend.read_into(buffer, 0, segment.view[PART : 2 * PART], None)
        assert moved.calls == [Op.WRITE, Op.READ]
        np.testing.assert_array_equal(segment.array[PART : 2 * PART], pattern(5))
        # A pin left at close is unpinned and unmapped by the worker's own teardown.
        backend._front_pid = os.getpid()
        assert isinstance(backend.pin_host(other.view, fd=other.fd), PinnedRange)
        assert mapped_in(backend.pid) == 1
    finally:
        backend.close()
        other.close()
    assert backend.returncode == 0


def test_unpin_after_the_worker_died_does_nothing(segment: Segment) -> None:
    faults: list[DeviceFault] = []
    backend = WorkerBackend("host", 0, on_fault=faults.append, log_level="error")
    try:
        pinned = backend.pin_host(segment.view, fd=segment.fd)
        buffer = backend.allocate_buffer(PART)
        assert isinstance(pinned, PinnedRange)
        os.kill(backend.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not faults and time.monotonic() < deadline:
            time.sleep(0.01)
        assert faults
        with pytest.raises(DeviceFault, match="killed by SIGKILL"):
            backend.write(buffer, 0, segment.view[:PART], None)
        with pytest.raises(DeviceFault, match="killed by SIGKILL"):
            backend.read_into(buffer, 0, segment.view[:PART], None)
        backend.unpin_host(pinned)  # a no-op, as every free after a fault
        backend.unpin_host(pinned)
        backend.destroy(buffer)
    finally:
        backend.close()
