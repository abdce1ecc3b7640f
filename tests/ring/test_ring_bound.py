"""Replayed ring launches: a launch checked once and replayed (a ticket, on the native engine;
checked each time by the Python loop), until anything it names changes."""

from __future__ import annotations

import contextlib
import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest

from accy._ring import Ring
from accy.protocol import ring as layout
from accyd.catalog.dtypes import DType
from accyd.core.daemon import Daemon
from accyd.core.prepared import PREPARED_PER_SESSION
from accyd.ring import RingDoor
from accyd.ring.engine.auto import RingEngine
from tests.ring.test_ring_core import open_ring, read, write
from tests.waiting import eventually

SAXPY = "accy.kernel.saxpy"
N = 256


def saxpy_scalars(a: float, n: int = N) -> bytes:
    return struct.pack("<I4xf4x", n, a)


@dataclass(frozen=True)
class Accumulator:
    """A saxpy session of one client on its ring, bound to ``acc`` (zeros) and ``ones``:
    ``launch(value)`` makes ``acc = value * ones + acc``."""

    daemon: Daemon
    client: str
    session: str
    acc: str
    ring: Ring
    handles: tuple[int, int, int]

    def launch(self, value: float, n: int = N) -> int:
        """``acc[:n] += value``."""
        s, acc, ones = self.handles
        return self.ring.launch(
            s, [ones, acc], [acc], saxpy_scalars(value, n), 2, notify=False, timeout=5
        )

    def sums(self) -> np.ndarray:
        return read(self.daemon, self.client, self.acc, N)


@contextlib.contextmanager
def accumulator(door: tuple[Daemon, RingDoor]) -> Iterator[Accumulator]:
    """An ``Accumulator``; its ring closed after, once its launches are over."""
    daemon, ring_door = door
    client = daemon.attach("bound").id
    session = daemon.load_pipeline(client, SAXPY).session_id
    acc = daemon.allocate_buffer(client, 4 * N, DType.F32).id
    ones = daemon.allocate_buffer(client, 4 * N, DType.F32).id
    write(daemon, client, ones, np.ones(N, np.float32))
    write(daemon, client, acc, np.zeros(N, np.float32))
    ring = open_ring(ring_door, client)
    try:
        s, a, o = (ring.new_handle() for _ in range(3))
        ring.bind(layout.Kind.BIND_SESSION, s, session, 1.0)
        ring.bind(layout.Kind.BIND_BUFFER, a, acc, 1.0)
        ring.bind(layout.Kind.BIND_BUFFER, o, ones, 1.0)
        yield Accumulator(daemon, client, session, acc, ring, (s, a, o))
        daemon.wait_launch(client, session)
        assert eventually(lambda: daemon.status().tenants[0].usage.launches_in_flight == 0)
    finally:
        ring.close()


def replayed(engine_of: RingEngine) -> int | None:
    """Launches made without Python (``None`` on the Python loop, which checks each): the
    native engine's tickets', and with --device-launch the GPU's (a client that pipelines
    goes back to the engine, whose own tickets launch the rest)."""
    if engine_of.kind != "native":
        return None
    stats = engine_of.stats()
    return int(stats["fast_records"]) + int(stats.get("device_launcher", {}).get("launched", 0))


def test_replayed_launches_compute_every_step_in_order(
    door: tuple[Daemon, RingDoor], engine_of: RingEngine
) -> None:
    with accumulator(door) as acc:
        last = 0
        for _ in range(40):  # acc = 1 + acc, forty times, most of them replayed
            last = acc.launch(1.0)
        acc.ring.wait(last, 10)
        assert acc.ring.errors() == []
        assert np.all(acc.sums() == 40.0)
        assert acc.daemon.status().launches_total == 40
        fast = replayed(engine_of)  # the first checked by the core, the rest its ticket's
        assert fast is None or fast >= 35, engine_of.stats()


def test_more_scalar_values_than_a_session_keeps_start_its_cache_over_losing_no_launch(
    door: tuple[Daemon, RingDoor], engine_of: RingEngine
) -> None:
    """A new value of ``n`` (which sizes the launch: each value is another prepared launch)
    at every launch, past the launches a session keeps prepared (its cache starts over,
    revoking its tickets while records of it are in the ring), then one value again and
    again: every launch lands exactly once, and the repeated value is replayed (a ticket's)
    after each start-over."""
    with accumulator(door) as acc:
        expected, count, last = np.zeros(N, np.float32), 0, 0
        for round_ in range(3):  # acc[:n] += value, each sum exact in f32: a launch lost
            # or made twice shows (no value is 0)
            new = [N - 1 - i for i in range(PREPARED_PER_SESSION + 36)]
            for n in [*new, *[N] * 20]:
                last = acc.launch(float(round_ + 1), n)
                expected[:n] += np.float32(round_ + 1)
                count += 1
        acc.ring.wait(last, 60)
        assert acc.ring.errors() == []
        assert np.array_equal(acc.sums(), expected)
        assert acc.daemon.status().launches_total == count
        fast = replayed(engine_of)  # each run of N: the first checked, the rest replayed
        assert fast is None or fast >= 3 * 15, engine_of.stats()


def test_a_new_value_of_a_free_scalar_at_every_launch_is_replayed(
    door: tuple[Daemon, RingDoor], engine_of: RingEngine
) -> None:
    """saxpy's ``a`` sizes nothing and no check reads it: on a backend whose prepared
    launches take new values, one ticket replays every value of it, each patched in before
    its launch; every launch lands once, with its own value."""
    with accumulator(door) as acc:
        values = [float(i + 1) for i in range(3 * PREPARED_PER_SESSION)]
        last = 0
        for value in values:
            last = acc.launch(value)
        acc.ring.wait(last, 60)
        assert acc.ring.errors() == []
        assert np.all(acc.sums() == np.float32(sum(values)))
        assert acc.daemon.status().launches_total == len(values)
        fast = replayed(engine_of)
        if fast is not None:
            # the first checked by the core, the rest its ticket's
            assert fast >= len(values) - 5, engine_of.stats()
            assert engine_of.stats()["calls"]["patch"] >= len(values) - 5


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_a_free_float_that_is_not_finite_is_refused_and_nothing_else_is(
    door: tuple[Daemon, RingDoor], bad: float
) -> None:
    with accumulator(door) as acc:
        seqs = [acc.launch(value) for value in (1.0, 2.0, bad, 3.0, bad, 4.0)]
        acc.ring.wait(seqs[-1], 10)
        errors = acc.ring.errors()
        assert [e.seq for e in errors] == [seqs[2], seqs[4]]
        assert all(e.reason == "LAUNCH_ARGUMENT_MISMATCH" for e in errors), errors
        assert all("finite" in e.message for e in errors), errors
        assert np.all(acc.sums() == 10.0)
        assert acc.daemon.status().launches_total == 4


def test_a_freed_buffer_is_never_launched_again(door: tuple[Daemon, RingDoor]) -> None:
    daemon, ring_door = door
    client = daemon.attach("bound").id
    session = daemon.load_pipeline(client, SAXPY).session_id
    x = daemon.allocate_buffer(client, 4 * N, DType.F32).id
    y = daemon.allocate_buffer(client, 4 * N, DType.F32).id
    ring = open_ring(ring_door, client)
    try:
        s, hx, hy = (ring.new_handle() for _ in range(3))
        ring.bind(layout.Kind.BIND_SESSION, s, session, 1.0)
        ring.bind(layout.Kind.BIND_BUFFER, hx, x, 1.0)
        ring.bind(layout.Kind.BIND_BUFFER, hy, y, 1.0)
        for _ in range(3):
            done = ring.launch(s, [hx, hy], [hy], saxpy_scalars(2.0), 2, notify=True, timeout=5)
            ring.wait(done, 10)
        daemon.free_buffer(client, y)
        refused = ring.launch(s, [hx, hy], [hy], saxpy_scalars(2.0), 2, notify=True, timeout=5)
        ring.wait(refused, 10)
        [error] = ring.errors()
        assert error.seq == refused and error.reason == "NOT_FOUND"
        assert daemon.status().launches_total == 3
    finally:
        ring.close()
