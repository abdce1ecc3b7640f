"""Ring records on both sides: written from a kept fixed part, read back a batch at a time."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from accy._ring import Ring
from accy.protocol import ring as layout
from accyd.backends.base import BackendKind
from accyd.catalog.dtypes import DType, Scalar
from accyd.catalog.model import ScalarSpec
from accyd.errors import QuotaExceeded
from accyd.ring.door import RingDoor, flight_spin_for
from accyd.ring.memory import RingMemory
from accyd.ring.records import Batch
from accyd.ring.ring import ServerRing
from accyd.ring.submitter import FLIGHT_SPIN_SECONDS, Submitter
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
    with pytest.raises(ValueError, match="at most 16 buffers"):
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
    batch = Batch(memory.records(6, 6), 6)
    assert [batch.seq(i) for i in range(6)] == seqs
    for index, seq in enumerate(seqs):
        assert batch.slot(index) == memory.record(seq)
        assert struct.unpack_from("<I", batch.slot(index), layout.SCALARS_OFFSET) == (index,)
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


def test_the_submitter_spins_on_launches_in_flight_only_where_threads_do_not_run_them() -> None:
    class Core:
        def __init__(self, kind: BackendKind) -> None:
            self.backend = type("B", (), {"kind": kind})()

    assert flight_spin_for(Core(BackendKind.HOST)) == 0.0  # type: ignore[arg-type]
    assert flight_spin_for(Core(BackendKind.CUDA)) == FLIGHT_SPIN_SECONDS  # type: ignore[arg-type]


class _Watch:
    def __init__(self) -> None:
        self.over = False
        self.closed = False

    def done(self) -> bool:
        return self.over

    def outcome(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True


class _Core:
    """A core whose bound launch goes stale once, and whose third check after that is refused
    (a quota): the launches checked again before it are still in flight."""

    def __init__(self) -> None:
        self.watch = _Watch()
        self.bound_calls: list[int] = []
        self.checks = 0

    def frees_of(self, client_id: str) -> int:
        return 0

    def touch(self, client_id: str) -> None:
        return None

    def session_scalars(self, client_id: str, session_id: str) -> tuple[ScalarSpec, ...]:
        return (ScalarSpec("n", DType.U32), ScalarSpec("a", DType.F32))

    def check_buffer(self, client_id: str, buffer_id: str) -> None:
        return None

    def bind_launch(
        self,
        client_id: str,
        session_id: str,
        operands: Sequence[str],
        results: Sequence[str],
        scalars: Mapping[str, Scalar],
    ) -> Any:
        self.checks += 1
        if self.checks == 4:  # the third record of the run, checked again
            raise QuotaExceeded("too many launches in flight", quota="launches")
        return ("bound", session_id)

    def launch_bound(self, bound: Any, count: int = 1) -> bool:
        self.bound_calls.append(count)
        return count == 1  # a run of several finds it stale

    def newest_launch(self, client_id: str, session_id: str) -> _Watch:
        return self.watch

    def launch_outcome(self, session_id: str, watch: Any) -> None:
        return None

    def reap(self, client_id: str, session_id: str) -> None:
        return None


def test_a_run_checked_again_keeps_its_launches_until_they_are_over(
    pair: tuple[RingMemory, Ring],
) -> None:
    memory, ring = pair
    core = _Core()
    server = ServerRing("ring_1", "cli_1", memory, core)  # type: ignore[arg-type]
    ring.bind(layout.Kind.BIND_SESSION, 1, "ses_1", 1.0)
    ring.bind(layout.Kind.BIND_BUFFER, 2, "buf_x", 1.0)
    ring.bind(layout.Kind.BIND_BUFFER, 3, "buf_y", 1.0)
    fixed = Ring.fixed_part(1, [2], [3], 2)
    ring.launch_fixed(fixed, SAXPY_SCALARS, (4, 1.0), False, 1.0)
    assert server.take(64) == 4  # three binds and a launch, checked and bound
    core.watch.over = True
    assert server.settle() and ring.done == 4
    core.watch = _Watch()
    run = [ring.launch_fixed(fixed, SAXPY_SCALARS, (4, 1.0), False, 1.0) for _ in range(3)]
    assert server.take(64) == 3
    assert core.bound_calls == [1, 3, 1, 1]  # the run went stale: each record checked again
    [refused] = ring.errors()
    assert refused.seq == run[2] and refused.reason == "QUOTA_EXCEEDED"
    assert not server.settle() and ring.done == 4  # two of them are still in flight
    core.watch.over = True
    assert server.settle() and ring.done == 7
    assert core.watch.closed


@pytest.mark.parametrize("spin", [True, False])
def test_launches_complete_whether_the_submitter_spins_or_naps(tmp_path: Path, spin: bool) -> None:
    daemon, _ = host_daemon()
    submitter = Submitter(spin=spin)
    assert submitter.flight_spin_seconds == (FLIGHT_SPIN_SECONDS if spin else 0.0)
    ring_door = RingDoor(daemon, tmp_path / "accyd.sock", submitter=submitter)
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
        daemon.close()
