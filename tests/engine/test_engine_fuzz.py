"""Hostile ring contents against the native engine: any bytes in the slots, any head, torn
records beside ticketed ones. The engine must never crash, launch only what matches a live
ticket byte for byte (but for a free scalar's field, any finite value of it), hand
everything else to Python in order, and keep serving."""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accy._ring import Ring
from accy.protocol import ring as layout
from accyd.ring.memory import RingMemory
from tests.engine.fake_driver import FakeDriver
from tests.waiting import eventually

native = pytest.importorskip("accyd.ring.engine._native", reason="the native engine is not built")

SLOTS = 32
SCALARS = struct.Struct("<I4xf4x48x")
A_AT = 84 + 8  # the free field (a: f32) in a record
FREE = (0b10, bytes([0, 4, 0, 0, 0, 0, 0, 0]), (0, 0x7F800000, 0, 0, 0, 0, 0, 0))


def _matches(raw: bytes, key: bytes, free: bool) -> bool:
    """The ticket's rule: the key's bytes, but for a free field any finite f32 (and any
    padding after it)."""
    if not free:
        return raw[12:148] == key
    a = int.from_bytes(raw[A_AT : A_AT + 4], "little")
    rest = raw[12:A_AT] + raw[A_AT + 8 : 148]
    return rest == key[: A_AT - 12] + key[A_AT + 8 - 12 :] and a & 0x7F800000 != 0x7F800000


def _slot(memory: RingMemory, seq: int) -> int:
    return layout.HEADER_SIZE + (seq % SLOTS) * layout.SLOT_SIZE


@st.composite
def _records(draw: st.DrawFn) -> list[tuple[str, bytes]]:
    """What a hostile client writes: copies of the ticketed record, the same with one byte
    changed, or any bytes at all (with the right seq, mostly, so they reach the checks)."""
    out = []
    for _ in range(draw(st.integers(1, 24))):
        kind = draw(st.sampled_from(["ticketed", "flipped", "garbage"]))
        noise = draw(st.binary(min_size=layout.SLOT_SIZE, max_size=layout.SLOT_SIZE))
        out.append((kind, noise))
    return out


@pytest.mark.parametrize("free", [False, True], ids=["exact", "free-scalar"])
@settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(records=_records(), head_jump=st.one_of(st.none(), st.integers(0, 1 << 64 - 1)))
def test_any_ring_contents_are_launched_only_by_their_ticket(
    records: list[tuple[str, bytes]], head_jump: int | None, free: bool
) -> None:
    driver = FakeDriver()
    engine = native.Engine(threads=1, epochs=4, counters=4, tokens=4, spin_ns=10_000)
    engine.set_driver(0, "table", **driver.table())
    memory = RingMemory(SLOTS)
    client = Ring(*[os.dup(fd) for fd in memory.fds()])
    engine.add_ring(1, memory.map, SLOTS, memory.submit_fd, memory.complete_fd, (0, 1))
    engine.start()
    try:
        fixed = Ring.fixed_part(1, [2], [3], 2)
        first = client.launch_fixed(fixed, SCALARS, (4, 1.0), False, 1.0)
        items: list[tuple[int, int, int, int, int]] = []
        while not items:
            items = engine.take_slow(1.0)
        template = bytes(memory.record(first))
        key = template[12:148]
        if free:
            key = key[: A_AT - 12] + bytes(8) + key[A_AT + 8 - 12 :]
        ticket = (key, 0, 77, 9, 0, 0, engine.epoch(0), FREE if free else None)
        engine.resume(1, 1, [(0, 9, 0)], [ticket])
        expected_fast = 0
        taken = 1
        for seq, (kind, noise) in enumerate(records, start=1):
            if kind == "ticketed":
                raw = seq.to_bytes(8, "little") + template[8:]
            elif kind == "flipped":
                at = 8 + noise[0] % (148 - 8)
                if free and noise[2] % 2:  # in the free field, mostly
                    at = A_AT + noise[0] % 8
                raw = bytearray(seq.to_bytes(8, "little") + template[8:])
                raw[at] ^= 1 + noise[1] % 255
                raw = bytes(raw)
            else:
                raw = noise if noise[0] % 4 == 0 else seq.to_bytes(8, "little") + noise[8:]
            at = _slot(memory, seq)
            client._map[at : at + layout.SLOT_SIZE] = raw
            client._publish()
            # Whatever is parked goes through "Python", which refuses it and resumes.
            while not eventually(lambda s=seq: client.taken > s, timeout=0.05):
                for item in engine.take_slow(0.05):
                    assert item[1] == 1
                    if item[0] == native.SLOW_RECORD:
                        assert item[2] == client.taken  # in order, the first not taken
                        engine.resume(1, item[2] + 1)
            seq_ok = int.from_bytes(raw[:8], "little") == seq
            kind_ok = int.from_bytes(raw[8:10], "little") == layout.Kind.LAUNCH
            flags_ok = int.from_bytes(raw[10:12], "little") & ~layout.NOTIFY == 0
            if seq_ok and kind_ok and flags_ok and _matches(raw, key, free):
                expected_fast += 1
            taken = seq + 1
            driver.finish_all()
            assert eventually(lambda t=taken: client.done == t, timeout=2.0)
        assert len(driver.launches) == expected_fast  # exactly the ticketed bytes launched
        assert all(launch == (77, 9) for launch in driver.launches)
        assert all(p[0] == 77 and p[2] == (0b10 if free else 0) for p in driver.patches)
        assert len(driver.patches) <= (expected_fast if free else 0)
        if head_jump is not None:  # a head that lies: broken off, or nothing new to take
            memory.set_u64(layout.HEAD, head_jump)
            engine.take_slow(0.05)
        assert engine.stats()["rings"] == 1  # it serves on
    finally:
        engine.remove_ring(1)
        engine.stop()
        client.close()
        memory.close()
