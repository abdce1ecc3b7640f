"""Shared-memory copies through the ring: one record each, in the ring's order with launches,
checked like a ``CopySegment`` call, and refused the same way."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from accy import Client, _link_transport
from accy._ring import Ring
from accy._ring_path import RingLaunches
from accy._seam import CopyRequest
from accy.errors import InvalidArgument, NotFound
from accy.protocol import ring as layout
from accy.testing import transport_of
from accyd.catalog.dtypes import DType
from accyd.core.daemon import Daemon
from accyd.doors.hostmem import Segments
from accyd.ring import RingDoor
from tests.launch_service.harness import ServerThread, make_config

SAXPY = "accy.kernel.saxpy"
N = 1 << 18  # 1 MiB of f32: above the shared-memory threshold


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerThread]:
    running = ServerThread(make_config(tmp_path, "unix"))
    try:
        yield running
    finally:
        running.stop()


def ring_of(client: Client) -> RingLaunches:
    launches = getattr(transport_of(client), "launches", None)
    assert isinstance(launches, RingLaunches), "the client opened no ring"
    return launches


def ring_head(client: Client) -> int:
    return ring_of(client).ring.head


def test_copies_go_through_the_ring_in_order_with_launches(server: ServerThread) -> None:
    rng = np.random.default_rng(11)
    x = rng.standard_normal(N).astype(np.float32)
    y = rng.standard_normal(N).astype(np.float32)
    with Client(server.address) as client, client.load(SAXPY) as session:
        shared = client.shared_array(N, np.float32)
        bx, by, out = (client.empty(N, np.float32) for _ in range(3))
        shared[:] = x
        bx.write(shared)
        head = ring_head(client)
        shared[:] = y
        by.write(shared)  # one record (a binding the first time, then none)
        assert ring_head(client) in (head + 1, head + 2)
        for a in (2.0, -1.0, 0.5):  # launch, read, launch, read: each read sees its launch
            session.launch(operands=[bx, by], results=[out], n=N, a=a, wait=False)
            out.read(out=shared)
            np.testing.assert_allclose(shared, np.float32(a) * x + y, rtol=1e-6)
        # A write through the ring, then a launch that reads it, with no wait between.
        shared[:] = 1.0
        bx.write(shared)
        session.launch(operands=[bx, by], results=[out], n=N, a=3.0, wait=False)
        np.testing.assert_allclose(out.read(), np.float32(3.0) + y, rtol=1e-6)
        calls = client.status()
        assert calls.my_buffers == 3


def test_a_ring_copy_is_checked_like_a_call(server: ServerThread) -> None:
    with Client(server.address) as alice, Client(server.address) as mallory:
        mine = alice.empty(N, np.float32)
        theirs = mallory.shared_array(N, np.float32)
        pool = _link_transport.shared_pool(transport_of(mallory))
        assert pool is not None
        segment = pool.locate(theirs)
        assert segment is not None
        # alice names mallory's segment through her own ring: it is not hers.
        alice_wire = transport_of(alice)
        alice_pool = _link_transport.shared_pool(alice_wire)
        assert alice_pool is not None
        own = alice.shared_array(N, np.float32)
        mine.write(own)  # opens alice's ring and binds her buffer
        assert alice_wire.path == "ring"
        copy = alice_wire.copy
        with pytest.raises(NotFound, match="ring record"):
            copy(CopyRequest(segment[0].id, 0, mine.id, 0, 16, to_buffer=True, timeout=5))
        placed = alice_pool.locate(own)
        assert placed is not None
        for segment_offset, buffer_offset, size in (
            (0, 0, (1 << 64) - 1),
            ((1 << 64) - 1, 0, 16),
            (0, 4 * N - 8, 16),
        ):
            with pytest.raises(InvalidArgument, match="outside"):
                copy(
                    CopyRequest(
                        placed[0].id, segment_offset, mine.id, buffer_offset, size, False, 5
                    )
                )
        # The ring goes on after refusals: a good copy still lands.
        own[:] = 4.0
        mine.write(own)
        np.testing.assert_array_equal(mine.read(), 4.0)


def test_a_copy_record_naming_no_buffer_is_refused(server: ServerThread) -> None:
    with Client(server.address) as client:
        buffer = client.empty(N, np.float32)
        shared = client.shared_array(N, np.float32)
        buffer.write(shared)
        launches = ring_of(client)
        ring = launches.ring
        pool = _link_transport.shared_pool(transport_of(client))
        assert pool is not None
        placed = pool.locate(shared)
        assert placed is not None
        seq = ring.copy(999, placed[0].id, (0, 0, 16), to_segment=True, timeout=5)
        with pytest.raises(NotFound, match="no buffer bound to handle 999"):
            launches._wait_for(seq, 5)
        assert layout.Kind.COPY == 5


def test_hostile_copy_records_are_refused_and_never_reach_outside(
    door: tuple[Daemon, RingDoor],
) -> None:
    daemon, ring_door = door
    segments = ring_door.copier.copies = Segments(daemon, ring_door.handoff)
    client = daemon.attach("hostile").id
    other = daemon.attach("other").id
    size = 4096
    buffer = daemon.allocate_buffer(client, size, DType.F32).id
    offer = segments.open(client, size)
    theirs = segments.open(other, size)
    ring = Ring.connect(ring_door.path, *_ring_offer(ring_door, client))
    try:
        handle = ring.new_handle()
        ring.bind(layout.Kind.BIND_BUFFER, handle, buffer, 1.0)
        rng = np.random.default_rng(3)
        huge = (1 << 64) - 1
        seqs = []
        for _ in range(300):
            picks = [0, 8, size - 8, size, size + 1, huge, int(rng.integers(0, 1 << 62))]
            fields = (
                picks[rng.integers(len(picks))],
                picks[rng.integers(len(picks))],
                picks[rng.integers(len(picks))],
            )
            segment = str(rng.choice([offer.segment_id, theirs.segment_id, "seg_nope", "x" * 100]))
            target = int(rng.choice([handle, handle + 7, 0]))
            seqs.append(
                ring.copy(target, segment, fields, to_segment=bool(rng.integers(2)), timeout=5)
            )
        ring.wait(seqs[-1], 30)
        reasons = {error.reason for error in ring.errors()}
        assert reasons <= {"INVALID_REQUEST", "NOT_FOUND", "FAILED_PRECONDITION"}, reasons
        assert "NOT_FOUND" in reasons and "INVALID_REQUEST" in reasons
        # Still serving, and a good copy after all that lands whole.
        good = ring.copy(handle, offer.segment_id, (0, 0, size), to_segment=False, timeout=5)
        ring.wait(good, 5)
        assert ring.errors() == []
        assert daemon.serving
    finally:
        ring.close()
        segments.close_client(client)
        segments.close_client(other)


def _ring_offer(ring_door: RingDoor, client_id: str) -> tuple[str, bytes]:
    offer = ring_door.offer(client_id, 64)
    return offer.ring_id, offer.ticket


def test_a_small_shared_array_is_copied_as_a_record_too(server: ServerThread) -> None:
    with Client(server.address) as client:
        buffer = client.empty(16, np.float32)
        shared = client.shared_array(16, np.float32)
        shared[:] = np.arange(16)
        buffer.write(shared)  # 64 bytes: far below the threshold for ordinary arrays
        head = ring_head(client)
        shared[:] = 0
        buffer.read(out=shared)
        assert ring_head(client) == head + 1  # one COPY record, no WriteBuffer/ReadBuffer
        np.testing.assert_array_equal(shared, np.arange(16))
        plain = np.arange(16, dtype=np.float32)
        buffer.write(plain)  # an ordinary small array still goes over gRPC
        assert ring_head(client) == head + 1
