"""Ring records on both sides: written from a kept fixed part, read back a batch at a time."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from accy._ring import Ring
from accy.errors import InvalidArgument
from accy.protocol import ring as layout
from accyd.backends.base import BackendKind
from accyd.catalog.dtypes import DType
from accyd.ring.door import RingDoor
from accyd.ring.engine.auto import open_engine
from accyd.ring.engine.pyloop import FLIGHT_SPIN_SECONDS, PythonLoop
from accyd.ring.memory import RingMemory
from accyd.scheduling import DeviceWork
from tests.core.daemon_fixtures import host_daemon

SAXPY_SCALARS = struct.Struct("<I4xf4x48x")


@pytest.fixture
def pair() -> Iterator[tuple[RingMemory, Ring]]:
    """A ring's memory (the daemon's side) and a client mapping the same memfd."""
    memory = RingMemory(8)
    fds = [os.dup(fd) for fd in memory.fds()]
    ring = Ring(*fds)
    try:
        yield memory, ring
    finally:
        ring.close()
        memory.close()


def slot_bytes(ring: Ring, seq: int) -> bytes:
    at = layout.HEADER_SIZE + (seq % ring.slots) * layout.SLOT_SIZE
    return bytes(ring._map[at : at + layout.RECORD.size])


def test_a_record_from_its_fixed_part_is_the_record_launch_writes(
    pair: tuple[RingMemory, Ring],
) -> None:
    _, ring = pair
    values = SAXPY_SCALARS.pack(1000, -0.0)[:16]
    plain = ring.launch(7, [3, 4], [5], values, 2, notify=True, timeout=1.0)
    fixed = Ring.fixed_part(7, [3, 4], [5], 2)
    kept = ring.launch_fixed(fixed, SAXPY_SCALARS, (1000, -0.0), True, 1.0)
    quiet = ring.launch_fixed(fixed, SAXPY_SCALARS, (1000, -0.0), False, 1.0)
    first, second, third = (layout.RECORD.unpack(slot_bytes(ring, s)) for s in (plain, kept, quiet))
    assert (first[0], second[0], third[0]) == (0, 1, 2)
    assert first[1:] == second[1:]  # all but the seq
    assert first[2] == layout.NOTIFY and third[2] == 0
    assert third[3:] == first[3:]
    assert first[3:7] == (7, 2, 1, 2) and first[7:10] == (3, 4, 5)
    assert struct.unpack_from("<I4xf", first[-1]) == (1000, -0.0)
    assert struct.pack("<f", struct.unpack_from("<I4xf", first[-1])[1]) == b"\0\0\0\x80"


def test_a_value_that_does_not_pack_publishes_nothing(pair: tuple[RingMemory, Ring]) -> None:
    memory, ring = pair
    fixed = Ring.fixed_part(1, [2], [3], 2)
    with pytest.raises(struct.error):
        ring.launch_fixed(fixed, SAXPY_SCALARS, (1.5, 2.0), False, 1.0)  # u32 from a float
    with pytest.raises(struct.error):
        ring.launch_fixed(fixed, SAXPY_SCALARS, (-1, 2.0), False, 1.0)  # out of range
    assert ring.head == 0 and memory.u64(layout.HEAD) == 0
    with pytest.raises(InvalidArgument, match="at most 16 buffers"):
        Ring.fixed_part(1, list(range(10)), list(range(7)), 0)


def test_records_read_as_one_batch_across_the_end_of_the_ring(
    pair: tuple[RingMemory, Ring],
) -> None:
    memory, ring = pair
    fixed = Ring.fixed_part(1, [2], [3], 2)
    for _ in range(6):  # let the daemon's side "take" them: done moves, slots come free
        ring.launch_fixed(fixed, SAXPY_SCALARS, (1, 1.0), False, 1.0)
    memory.set_u64(layout.DONE, 6)
    seqs = [ring.launch_fixed(fixed, SAXPY_SCALARS, (s, 2.0), False, 1.0) for s in range(6)]
    assert seqs == list(range(6, 12))  # slots 6, 7, 0, 1, 2, 3
    records = memory.records(6, 6)
    slots = [records[i * layout.SLOT_SIZE : (i + 1) * layout.SLOT_SIZE] for i in range(6)]
    assert [int.from_bytes(slot[:8], "little") for slot in slots] == seqs
    for index, seq in enumerate(seqs):
        assert slots[index] == memory.record(seq)
        assert struct.unpack_from("<I", slots[index], layout.SCALARS_OFFSET) == (index,)
    assert memory.records(6, 2) == memory.record(6) + memory.record(7)


def test_records_written_across_the_end_of_the_ring_read_back_whole(
    pair: tuple[RingMemory, Ring],
) -> None:
    """What a ``RingStream`` frame carries lands in the slots it names, wrapping at the end."""
    memory, _ = pair
    slots = memory.slot_count
    records = b"".join(bytes([index]) * layout.SLOT_SIZE for index in range(1, 5))
    memory.write(slots - 2, records)  # the last two slots, then the first two
    assert memory.records(slots - 2, 4) == records
    assert memory.record(slots - 1) == bytes([2]) * layout.SLOT_SIZE
    assert memory.record(slots) == memory.record(0) == bytes([3]) * layout.SLOT_SIZE
    memory.write(1, records[: layout.SLOT_SIZE])  # no wrap
    assert memory.record(1) == bytes([1]) * layout.SLOT_SIZE


def test_a_ring_sees_new_errors_without_reading_them(pair: tuple[RingMemory, Ring]) -> None:
    memory, ring = pair
    assert not ring.has_errors()
    memory.set_u64(layout.ERRORS, 1)
    assert ring.has_errors()
    ring.errors()
    assert not ring.has_errors()


def test_the_loop_spins_on_launches_in_flight_only_where_threads_do_not_run_them() -> None:
    class Core:
        def __init__(self, kind: BackendKind) -> None:
            self.backends = {0: type("B", (), {"kind": kind})()}

    host = open_engine(Core(BackendKind.HOST), kind="python")  # type: ignore[arg-type]
    device = open_engine(Core(BackendKind.CUDA), kind="python")  # type: ignore[arg-type]
    try:
        assert isinstance(host, PythonLoop) and isinstance(device, PythonLoop)
        assert host.flight_spin_seconds == 0.0
        assert device.flight_spin_seconds == (FLIGHT_SPIN_SECONDS if device.spin else 0.0)
    finally:
        host.close()
        device.close()


@pytest.mark.parametrize("spin", [True, False])
def test_launches_complete_whether_the_loop_spins_or_naps(tmp_path: Path, spin: bool) -> None:
    daemon, _ = host_daemon()
    loop = PythonLoop(daemon, spin=spin)
    assert loop.flight_spin_seconds == (FLIGHT_SPIN_SECONDS if spin else 0.0)
    work = DeviceWork(2)
    ring_door = RingDoor(daemon, tmp_path / "accyd.sock", loop, work=work)
    loop.start()
    ring_door.start()
    try:
        client = daemon.attach("spin").id
        session = daemon.load_pipeline(client, "accy.kernel.saxpy").session_id
        x, y = (daemon.allocate_buffer(client, 16, DType.F32).id for _ in range(2))
        with daemon.open_write(client, x) as transfer:
            transfer.write(0, np.ones(4, np.float32).tobytes())
        offer = ring_door.offer(client, 64)
        ring = Ring.connect(ring_door.path, offer.ring_id, offer.ticket)
        try:
            ring.bind(layout.Kind.BIND_SESSION, 1, session, 1.0)
            ring.bind(layout.Kind.BIND_BUFFER, 2, x, 1.0)
            ring.bind(layout.Kind.BIND_BUFFER, 3, y, 1.0)
            fixed = Ring.fixed_part(1, [2, 3], [3], 2)
            for step in range(100):  # y = 1 * x + y, a hundred times, some waited for
                last = ring.launch_fixed(fixed, SAXPY_SCALARS, (4, 1.0), step % 10 == 9, 5.0)
                if step % 10 == 9:
                    ring.wait(last, 10.0)
            assert ring.errors() == []
            got = np.frombuffer(daemon.open_read(client, y).read(0, 16), np.float32)
            np.testing.assert_array_equal(got, np.full(4, 100.0, np.float32))
        finally:
            ring.close()
    finally:
        ring_door.close()
        loop.close()
        daemon.close()
        work.close()
