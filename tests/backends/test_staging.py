"""Large copies of shared host memory staged through the fixed pinned pool, then direct once locked.

The host backend runs the same staging path a GPU's first copies of a fresh
segment take (the chunks, the slots shared between callers, the overlap); the
CUDA tests (``cuda``-marked) run it on the device, with the slots page-locked.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from accyd.backends.base import Backend, DeviceBuffer, Stream
from accyd.backends.cuda import cuda_available
from accyd.backends.host import HostBackend
from accyd.backends.shared_ranges import REGISTER_AFTER
from accyd.backends.staging import CHUNK_BYTES, Staging
from accyd.errors import LaunchFailed

SIZE = 3 * CHUNK_BYTES + 12345  # not a whole number of chunks


def backends() -> list[Any]:
    return [
        "host",
        pytest.param(
            "cuda",
            marks=[
                pytest.mark.cuda,
                pytest.mark.skipif(not cuda_available(), reason="no CUDA driver or device here"),
            ],
        ),
    ]


@pytest.fixture(params=backends())
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "cuda":
        from accyd.backends.cuda import CudaBackend

        made: Backend = CudaBackend(0)
    else:
        made = HostBackend()
    try:
        yield made
    finally:
        made.close()


def staged_count(backend: Backend) -> int:
    staging = backend._staged.staging.peek()  # type: ignore[attr-defined]
    return 0 if staging is None else int(staging.staged)


def round_trip(backend: Backend, shared: memoryview, buffer: DeviceBuffer, stream: Stream) -> None:
    backend.write(buffer, 0, shared, stream)
    shared[:] = b"\0" * shared.nbytes
    backend.read_into(buffer, 0, shared, stream)


def test_a_shared_range_is_staged_until_it_earned_locking_then_copied_directly(
    backend: Backend,
) -> None:
    memory = bytearray(SIZE)
    shared = memoryview(memory)
    data = np.random.default_rng(3).integers(0, 256, SIZE, dtype=np.uint8)
    pinned = backend.pin_host(shared)
    stream = backend.create_stream()
    buffer = backend.allocate_buffer(SIZE)
    try:
        np.frombuffer(memory, np.uint8)[:] = data
        round_trip(backend, shared, buffer, stream)
        assert np.array_equal(np.frombuffer(memory, np.uint8), data)
        assert staged_count(backend) == 2, "a fresh shared range's copies are staged"
        # Offset copies in and out of a part of the range, through the same slots.
        part = shared[1000 : 1000 + CHUNK_BYTES + 7]
        backend.write(buffer, 64, part, stream)
        out = bytearray(part.nbytes)
        backend.read_into(buffer, 64, memoryview(out), stream)
        assert out == part.tobytes()
        for _ in range(REGISTER_AFTER):
            round_trip(backend, shared, buffer, stream)
        pinned.done.wait(30)  # type: ignore[attr-defined]
        assert pinned.registered  # type: ignore[attr-defined]
        before = staged_count(backend)
        round_trip(backend, shared, buffer, stream)
        assert staged_count(backend) == before, "a locked range's copies go directly"
        assert np.array_equal(np.frombuffer(memory, np.uint8), data)
    finally:
        backend.unpin_host(pinned)
        backend.destroy(buffer)
        backend.destroy_stream(stream)


def test_copies_of_unshared_memory_and_small_ones_are_not_staged(backend: Backend) -> None:
    stream = backend.create_stream()
    buffer = backend.allocate_buffer(SIZE)
    small = memoryview(bytearray(4096))
    pinned = backend.pin_host(small)
    try:
        backend.write(buffer, 0, memoryview(bytearray(SIZE)), stream)
        backend.write(buffer, 0, small, stream)
        assert staged_count(backend) == 0
    finally:
        backend.unpin_host(pinned)
        backend.destroy(buffer)


def test_concurrent_staged_copies_share_the_slots_and_each_is_right(backend: Backend) -> None:
    count = 6  # more than the slots allow at once (each copy holds two)
    memory = bytearray(count * SIZE)
    shared = memoryview(memory)
    pinned = backend.pin_host(shared)
    rng = np.random.default_rng(5)
    data = rng.integers(0, 256, count * SIZE, dtype=np.uint8)
    np.frombuffer(memory, np.uint8)[:] = data
    buffers = [backend.allocate_buffer(SIZE) for _ in range(count)]
    streams = [backend.create_stream() for _ in range(count)]
    errors: list[BaseException] = []

    def one(index: int) -> None:
        part = shared[index * SIZE : (index + 1) * SIZE]
        try:
            backend.write(buffers[index], 0, part, streams[index])
            part[:] = b"\0" * SIZE
            backend.read_into(buffers[index], 0, part, streams[index])
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=one, args=(index,)) for index in range(count)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == []
        assert np.array_equal(np.frombuffer(memory, np.uint8), data)
    finally:
        backend.unpin_host(pinned)
        for buffer in buffers:
            backend.destroy(buffer)


class _FailingDma:
    def __init__(self) -> None:
        self.sent = 0

    def to_device(self, slot: int, *args: object) -> int:
        self.sent += 1
        if self.sent == 2:
            raise LaunchFailed("planted")
        return slot

    def to_host(self, slot: int, *args: object) -> int:
        return slot

    def wait(self, token: int) -> None:
        return None


def test_a_failed_dma_is_raised_and_its_slots_come_back() -> None:
    slots = [memoryview(bytearray(1 << 20)) for _ in range(2)]
    staging: Staging[int] = Staging(slots, _FailingDma(), copy_threads=2)
    buffer = DeviceBuffer(1, HostBackend().kind, 4 << 20, 0)
    with pytest.raises(LaunchFailed, match="planted"):
        staging.write(buffer, 0, memoryview(bytearray(4 << 20)), None)
    assert sorted(staging._free) == [0, 1]
    staging.close()


def test_closing_waits_for_the_staging_made_in_the_background() -> None:
    """A backend's staging is made on a thread from its start; closed before that thread is
    done, the backend would free the context under it, and the make's page-locked allocation
    failed with CONTEXT_IS_DESTROYED, recorded as a sticky fault of the device for the whole
    process (seen on the H200 when a test closed its backend within milliseconds)."""
    import time

    from accyd.backends.shared_ranges import SharedRanges, StagedCopies
    from accyd.backends.staging import LazyStaging

    started, done = threading.Event(), threading.Event()
    calls = []

    def make() -> Any:
        calls.append(1)
        started.set()
        time.sleep(0.3)
        done.set()
        return None

    staged = StagedCopies(
        SharedRanges(lambda view: view, lambda anchor: None), LazyStaging(make, background=True)
    )
    assert started.wait(5)
    staged.close()
    assert done.is_set()  # close returned only once the make was over
    assert staged.staging.get() is None and len(calls) == 1  # and none is made after
