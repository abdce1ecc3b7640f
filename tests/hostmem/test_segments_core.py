"""Segments in the daemon: quota, ownership, copies ordered with launches, and teardown."""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from accy import _handoff
from accyd.catalog.dtypes import DType, Scalar
from accyd.core.daemon import Daemon
from accyd.core.tenants import Quotas
from accyd.doors.hostmem import Segments
from accyd.doors.hostmem.handoff import Handoff
from accyd.doors.hostmem.segments import MAX_SEGMENTS_PER_CLIENT
from accyd.errors import FailedPrecondition, InvalidRequest, NotFound, QuotaExceeded
from tests.core.daemon_fixtures import host_daemon

SAXPY = "accy.kernel.saxpy"
QUOTA = 8 << 20


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[Daemon, Segments, Handoff]]:
    daemon, _ = host_daemon(quotas=Quotas(memory_bytes=QUOTA))
    handoff = Handoff(tmp_path / "accyd.sock")
    handoff.start()
    segments = Segments(daemon, handoff)
    try:
        yield daemon, segments, handoff
    finally:
        segments.close_all()
        handoff.close()
        daemon.close()


def take(handoff: Handoff, offer_id: str, ticket: bytes, size: int) -> mmap.mmap:
    (fd,) = _handoff.take(handoff.path, offer_id, ticket, 1)
    try:
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def test_segments_count_against_the_memory_quota(
    world: tuple[Daemon, Segments, Handoff],
) -> None:
    daemon, segments, _ = world
    client = daemon.attach("q").id
    first = segments.open(client, 6 << 20)
    with pytest.raises(QuotaExceeded):  # 6 MiB held: a 4 MiB buffer passes the 8 MiB quota
        daemon.allocate_buffer(client, 4 << 20)
    with pytest.raises(QuotaExceeded):
        segments.open(client, 4 << 20)
    segments.close(client, first.segment_id)
    daemon.allocate_buffer(client, 4 << 20)  # the segment's bytes came back
    with pytest.raises(NotFound):
        segments.close(client, first.segment_id)


def test_copies_are_ordered_with_launches_and_checked(
    world: tuple[Daemon, Segments, Handoff],
) -> None:
    daemon, segments, handoff = world
    client = daemon.attach("c").id
    n = 1 << 18
    x = np.arange(n, dtype=np.float32)
    offer = segments.open(client, 2 * x.nbytes)
    shared = take(handoff, offer.segment_id, offer.ticket, offer.byte_size)
    view = np.frombuffer(shared, dtype=np.float32)
    view[:n] = x
    session = daemon.load_pipeline(client, SAXPY).session_id
    bx = daemon.allocate_buffer(client, x.nbytes, DType.F32).id
    out = daemon.allocate_buffer(client, x.nbytes, DType.F32).id
    segments.prepare(client, offer.segment_id, 0, bx, 0, x.nbytes, to_buffer=True).run()
    daemon.launch(client, session, [bx, bx], [out], {"n": Scalar.u32(n), "a": Scalar.f32(2.0)})
    # No wait: the read is ordered after the launch by the buffer's marks.
    segments.prepare(client, offer.segment_id, x.nbytes, out, 0, x.nbytes, to_buffer=False).run()
    np.testing.assert_array_equal(view[n:], 3 * x)
    with pytest.raises(InvalidRequest):
        segments.prepare(
            client, offer.segment_id, 2 * x.nbytes - 4, out, 0, 8, to_buffer=False
        ).run()
    with pytest.raises(InvalidRequest):
        segments.prepare(client, offer.segment_id, 0, out, x.nbytes - 4, 8, to_buffer=True).run()
    other = daemon.attach("other").id
    with pytest.raises(NotFound):  # ids are per client
        segments.prepare(other, offer.segment_id, 0, out, 0, 8, to_buffer=False).run()
    del view
    shared.close()


def test_a_detached_client_leaves_no_segment(world: tuple[Daemon, Segments, Handoff]) -> None:
    daemon, segments, handoff = world
    fds = _segment_fds()
    mapped = _segment_mappings()  # other tests of this process may hold theirs yet
    client = daemon.attach("gone").id
    taken = segments.open(client, 1 << 20)
    untaken = segments.open(client, 1 << 20)
    take(handoff, taken.segment_id, taken.ticket, taken.byte_size).close()
    segments.close_client(client)
    daemon.detach(client)
    assert segments.count(client) == 0
    assert _segment_fds() == fds
    assert _segment_mappings() == mapped
    with pytest.raises(_handoff.HandoffRefused):  # its offer went with it
        _handoff.take(handoff.path, untaken.segment_id, untaken.ticket, 1)
    assert daemon.status().tenants[0].usage.memory_bytes == 0


def test_segment_limits(world: tuple[Daemon, Segments, Handoff], tmp_path: Path) -> None:
    daemon, segments, _ = world
    client = daemon.attach("l").id
    with pytest.raises(InvalidRequest):
        segments.open(client, 0)
    with pytest.raises(NotFound):
        segments.open(client, 4096, device=3)
    for _ in range(MAX_SEGMENTS_PER_CLIENT):
        segments.open(client, 4096)
    with pytest.raises(QuotaExceeded):
        segments.open(client, 4096)
    with pytest.raises(FailedPrecondition):
        Segments(daemon, None).open(client, 4096)


def _segment_fds() -> int:
    """Descriptors of segments open in this process.

    Only segments: other tests' daemons and gRPC threads open and close descriptors
    of their own at any moment, so a count of all of them is not this test's to assert.
    """
    count = 0
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # closed since it was listed
            count += "accy-segment" in os.readlink(f"/proc/self/fd/{name}")
    return count


def _segment_mappings() -> int:
    """Mappings of segments in this process (the daemon's side and any client's)."""
    return Path("/proc/self/maps").read_text().count("accy-segment")
