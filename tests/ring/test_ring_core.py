"""The submission ring against the host backend: launches checked, ordered, refused and freed."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from accy._ring import Ring, RingClosed
from accy.protocol import ring as layout
from accyd.catalog.dtypes import DType, Scalar
from accyd.core.daemon import Daemon
from accyd.errors import QuotaExceeded
from accyd.ring import RingDoor
from accyd.ring import ring as ring_module
from accyd.ring.door import RINGS_PER_CLIENT

SCAN = "accy.kernel.device_scan"
SAXPY = "accy.kernel.saxpy"


def open_ring(ring_door: RingDoor, client_id: str) -> Ring:
    offer = ring_door.offer(client_id, 64, device_waits=True)  # as accy's client asks
    return Ring.connect(ring_door.path, offer.ring_id, offer.ticket)


def u32s(*values: int) -> bytes:
    return b"".join(struct.pack("<I4x", v) for v in values)


def write(daemon: Daemon, client_id: str, buffer_id: str, data: np.ndarray) -> None:
    with daemon.open_write(client_id, buffer_id) as transfer:
        transfer.write(0, data.tobytes())


def read(daemon: Daemon, client_id: str, buffer_id: str, count: int) -> np.ndarray:
    return np.frombuffer(daemon.open_read(client_id, buffer_id).read(0, count * 4), np.float32)


def test_launches_through_the_ring_compute_in_order(door: tuple[Daemon, RingDoor]) -> None:
    daemon, ring_door = door
    client = daemon.attach("ring").id
    n = 5000
    x = np.random.default_rng(1).random(n, dtype=np.float32)
    session = daemon.load_pipeline(client, SCAN).session_id
    xs = daemon.allocate_buffer(client, 4 * n, DType.F32).id
    ys = daemon.allocate_buffer(client, 4 * n, DType.F32).id
    zs = daemon.allocate_buffer(client, 4 * n, DType.F32).id
    write(daemon, client, xs, x)
    daemon.allocate_intermediates(client, session, {"n": Scalar.u32(n)})
    ring = open_ring(ring_door, client)
    try:
        s = ring.new_handle()
        ring.bind(layout.Kind.BIND_SESSION, s, session, 1.0)
        hx, hy, hz = (ring.new_handle() for _ in range(3))
        for handle, buffer_id in ((hx, xs), (hy, ys), (hz, zs)):
            ring.bind(layout.Kind.BIND_BUFFER, handle, buffer_id, 1.0)
        ring.launch(s, [hx], [hy], u32s(n), 1, notify=False, timeout=1.0)
        # The second scan reads the first's result: only stream order makes it right.
        last = ring.launch(s, [hy], [hz], u32s(n), 1, notify=True, timeout=1.0)
        ring.wait(last, 5.0)
        assert ring.errors() == []
        expected = np.cumsum(np.cumsum(x, dtype=np.float64))
        got = read(daemon, client, zs, n)
        assert np.allclose(got, expected, rtol=1e-4)
    finally:
        ring.close()


def test_a_bad_record_is_refused_and_named_and_the_ring_goes_on(
    door: tuple[Daemon, RingDoor],
) -> None:
    daemon, ring_door = door
    alice, bob = daemon.attach("alice").id, daemon.attach("bob").id
    session = daemon.load_pipeline(alice, SCAN).session_id
    theirs = daemon.allocate_buffer(bob, 4096, DType.F32).id
    small = daemon.allocate_buffer(alice, 64, DType.F32).id
    ring = open_ring(ring_door, alice)
    try:
        s = ring.new_handle()
        ring.bind(layout.Kind.BIND_SESSION, s, session, 1.0)
        other = ring.new_handle()
        refused_bind = ring.bind(layout.Kind.BIND_BUFFER, other, theirs, 1.0)
        h = ring.new_handle()
        ring.bind(layout.Kind.BIND_BUFFER, h, small, 1.0)
        too_big = ring.launch(s, [h], [h], u32s(5000), 1, notify=False, timeout=1.0)
        unknown = ring.launch(s, [99], [h], u32s(16), 1, notify=False, timeout=1.0)
        wrong_count = ring.launch(s, [h], [h], b"", 0, notify=True, timeout=1.0)
        ring.wait(wrong_count, 5.0)
        errors = {e.seq: e for e in ring.errors()}
        assert errors[refused_bind].reason == "NOT_FOUND"  # another client's id: unknown
        assert errors[too_big].reason == "LAUNCH_ARGUMENT_MISMATCH"
        assert errors[unknown].reason == "NOT_FOUND"
        assert errors[unknown].field == "operands[0]"
        assert errors[wrong_count].field == "runtime_scalars"
        assert daemon.status().launches_total == 0
    finally:
        ring.close()


def test_garbage_in_the_ring_never_reads_outside_it(door: tuple[Daemon, RingDoor]) -> None:
    daemon, ring_door = door
    client = daemon.attach("fuzz").id
    ring = open_ring(ring_door, client)
    try:
        rng = np.random.default_rng(7)
        for _ in range(200):
            slot = ring._slot(5.0)
            ring._map[slot : slot + layout.SLOT_SIZE] = rng.bytes(layout.SLOT_SIZE)
            struct.pack_into("<Q", ring._map, slot, ring.head)  # a well-formed seq, junk after
            ring._publish()
        ring.flush(5.0)
        assert len(ring.errors()) > 0
        # A head far past the tail breaks only this ring.
        ring._words[layout.HEAD >> 3] = ring.head + 10_000
        with pytest.raises(RingClosed):
            ring.wait(ring.head + 5000, 5.0)
        assert daemon.serving
    finally:
        ring.close()


def test_a_ticket_is_good_once_and_only_with_its_ring(door: tuple[Daemon, RingDoor]) -> None:
    daemon, ring_door = door
    client = daemon.attach("c").id
    offer = ring_door.offer(client, 64)
    with pytest.raises(RingClosed):
        Ring.connect(ring_door.path, offer.ring_id, os.urandom(layout.TICKET_BYTES))
    ring = Ring.connect(ring_door.path, offer.ring_id, offer.ticket)
    ring.close()
    with pytest.raises(RingClosed):
        Ring.connect(ring_door.path, offer.ring_id, offer.ticket)


def test_closing_a_client_closes_its_ring(door: tuple[Daemon, RingDoor]) -> None:
    daemon, ring_door = door
    client = daemon.attach("c").id
    ring = open_ring(ring_door, client)
    try:
        ring_door.close_client(client)
        with pytest.raises(RingClosed):
            ring.launch(1, [], [], b"", 0, notify=False, timeout=1.0)
    finally:
        ring.close()


def test_a_ring_binds_a_bounded_number_of_handles(
    door: tuple[Daemon, RingDoor], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that binds and never unbinds is refused past the bound, and unbinding lets it
    bind again: the daemon's tables for one ring cannot grow without end."""
    monkeypatch.setattr(ring_module, "BOUND_HANDLES", 3)
    daemon, ring_door = door
    client = daemon.attach("binder").id
    buffers = [daemon.allocate_buffer(client, 64, DType.F32).id for _ in range(4)]
    ring = open_ring(ring_door, client)
    try:
        handles = [ring.new_handle() for _ in buffers]
        seqs = [
            ring.bind(layout.Kind.BIND_BUFFER, handle, buffer_id, 1.0)
            for handle, buffer_id in zip(handles, buffers, strict=True)
        ]
        ring.wait(seqs[-1], 5.0)
        (refused,) = ring.errors()
        assert (refused.seq, refused.reason) == (seqs[3], "QUOTA_EXCEEDED")
        assert "at most 3 bound" in refused.message
        ring.unbind(handles[0], 1.0)
        again = ring.bind(layout.Kind.BIND_BUFFER, handles[3], buffers[3], 1.0)
        ring.wait(again, 5.0)
        assert ring.errors() == []
    finally:
        ring.close()


def test_a_client_holds_a_bounded_number_of_rings(door: tuple[Daemon, RingDoor]) -> None:
    """Rings taken or only offered count: a client cannot make the daemon map (and its
    submitter look at) rings without end; another client is not held back by it."""
    daemon, ring_door = door
    greedy, other = daemon.attach("greedy").id, daemon.attach("other").id
    taken = [open_ring(ring_door, greedy) for _ in range(RINGS_PER_CLIENT // 2)]
    offered = [ring_door.offer(greedy) for _ in range(RINGS_PER_CLIENT - len(taken))]
    try:
        with pytest.raises(QuotaExceeded, match=f"{RINGS_PER_CLIENT} rings open or offered"):
            ring_door.offer(greedy)
        open_ring(ring_door, other).close()
        assert len(offered) + len(taken) == RINGS_PER_CLIENT
        ring_door.close_client(greedy)  # its detach: its rings and offers go
        open_ring(ring_door, greedy).close()
    finally:
        for ring in taken:
            ring.close()
