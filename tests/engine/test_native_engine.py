"""The native engine's C code against a fake driver table: parser, tickets, epochs, counters.

Each test publishes records the way a client does (``accy._ring.Ring`` on the same memory)
and drives the engine as its Python side does (tickets installed by ``resume``); the fake
driver records every launch and decides when work is over. Nothing here needs a GPU: this
is the code the GPU runs, through another table.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable

import pytest

from accy._ring import Ring
from accy.protocol import ring as layout
from accyd.ring.memory import RingMemory
from tests.engine.fake_driver import FakeDriver
from tests.waiting import eventually

native = pytest.importorskip("accyd.ring.engine._native", reason="the native engine is not built")

SCALARS = struct.Struct("<I4xf4x48x")
STREAM, EXEC, TOKEN = 0x5000, 0x7000, 3
NONE = 0xFFFFFFFF


class Harness:
    """One engine, one fake driver (slot 0), one ring and a client mapping it."""

    def __init__(
        self,
        slots: int = 64,
        threads: int = 1,
        *,
        notify_always: bool = False,
        timings: bool = False,
        device: bool = False,
        patches: bool = True,
    ) -> None:
        self.driver = FakeDriver()
        self.engine = native.Engine(
            threads=threads,
            epochs=64,
            counters=8,
            tokens=8,
            spin_ns=20_000,
            flight_spin_ns=0,
            timings=timings,
        )
        table = self.driver.table()
        if not patches:
            del table["patch"]
        self.engine.set_driver(0, "table", **table)
        self.memory = RingMemory(slots)
        self.client = Ring(*[os.dup(fd) for fd in self.memory.fds()])
        self.counters = (0, 1)
        self.engine.add_ring(
            1,
            self.memory.map,
            slots,
            self.memory.submit_fd,
            self.memory.complete_fd,
            self.counters,
            notify_always,
            device=device,
        )
        self.engine.start()
        self.fixed = Ring.fixed_part(1, [2], [3], 2)

    def publish(self, n: int = 4, a: float = 1.0, *, notify: bool = False) -> int:
        return self.client.launch_fixed(self.fixed, SCALARS, (n, a), notify, 1.0)

    def finish(self, seq: int) -> None:
        """Once the engine took record ``seq`` (its event is recorded), its work is over."""
        assert eventually(lambda: self.client.taken > seq)
        self.driver.finish_all()

    def key(self, seq: int) -> bytes:
        return bytes(self.memory.record(seq)[12:148])

    def ticket(self, seq: int, epoch: int = 0) -> tuple[bytes, int, int, int, int, int, int]:
        return (self.key(seq), 0, EXEC, STREAM, TOKEN, epoch, self.engine.epoch(epoch))

    def slow(self, timeout: float = 2.0) -> list[tuple[int, int, int, int, int]]:
        deadline = time.monotonic() + timeout
        items: list[tuple[int, int, int, int, int]] = []
        while not items and time.monotonic() < deadline:
            items = self.engine.take_slow(0.05)
        return items

    def close(self) -> None:
        self.engine.remove_ring(1)
        self.engine.stop()
        self.client.close()
        self.memory.close()


def first_sight(h: Harness) -> int:
    """Publish a launch and decide it as Python would: resumed with a ticket for it."""
    seq = h.publish()
    [item] = h.slow()
    assert item == (native.SLOW_RECORD, 1, seq, 0, -1)
    h.engine.resume(1, seq + 1, [(0, STREAM, TOKEN)], [h.ticket(seq)])
    return seq


def test_the_layout_is_the_clients() -> None:
    ours = native.LAYOUT
    assert (ours["HEAD"], ours["TAIL"], ours["DONE"]) == (layout.HEAD, layout.TAIL, layout.DONE)
    assert ours["CLIENT_WAITS"] == layout.CLIENT_WAITS
    assert ours["DAEMON_WAITS"] == layout.DAEMON_WAITS and ours["CLOSED"] == layout.CLOSED
    assert ours["LEFT"] == layout.LEFT
    assert ours["HEADER_SIZE"] == layout.HEADER_SIZE and ours["SLOT_SIZE"] == layout.SLOT_SIZE
    assert ours["KEY_END"] == layout.RECORD.size and ours["LAUNCH"] == layout.Kind.LAUNCH
    assert ours["NOTIFY"] == layout.NOTIFY


def test_a_record_without_a_ticket_goes_to_python_and_waits_for_it(harness: Harness) -> None:
    h = harness
    seq = h.publish()
    [item] = h.slow()
    assert item == (native.SLOW_RECORD, 1, seq, 0, -1)
    later = h.publish()  # parked behind the first: not taken, not handed over
    time.sleep(0.05)
    assert h.engine.take_slow(0.0) == [] and h.client.taken == seq
    h.engine.resume(1, seq + 1, [(0, STREAM, TOKEN)])
    [again] = h.slow()
    assert again[2] == later  # no ticket for it either
    assert eventually(lambda: h.client.taken == later)
    assert h.driver.records and h.driver.records[0][1] == STREAM  # done waits for its stream
    assert h.client.done < seq + 1
    h.finish(seq)
    assert eventually(lambda: h.client.done == seq + 1)


def test_a_ticketed_run_is_launched_without_python(harness: Harness) -> None:
    h = harness
    seq = first_sight(h)
    run = [h.publish() for _ in range(40)]
    assert eventually(lambda: len(h.driver.launches) == 40)
    assert h.driver.launches == [(EXEC, STREAM)] * 40
    assert h.engine.take_slow(0.05) == []
    h.finish(run[-1])
    assert eventually(lambda: h.client.done == run[-1] + 1)
    assert h.engine.launched() == [(TOKEN, 40)]
    assert h.engine.launched() == []  # taken once
    assert 1 in h.engine.touched()
    stats = h.engine.stats()
    assert stats["fast_records"] == 40 and stats["launches"] == 40 and seq == 0


def test_other_scalars_are_another_launch(harness: Harness) -> None:
    h = harness
    first_sight(h)
    seq = h.publish(n=8)
    [item] = h.slow()
    assert item[2] == seq and h.driver.launches == []


def test_a_bumped_epoch_sends_the_next_record_to_python(harness: Harness) -> None:
    h = harness
    first_sight(h)
    h.publish()
    assert eventually(lambda: len(h.driver.launches) == 1)
    h.engine.bump(0)
    h.engine.quiesce()  # no launch checked against the old value after this
    seq = h.publish()
    [item] = h.slow()
    assert item[2] == seq and len(h.driver.launches) == 1


def test_the_launch_limit_holds_on_the_fast_path(harness: Harness) -> None:
    h = harness
    h.engine.set_limit(h.counters[0], 3)
    h.engine.set_external(h.counters[0], 1)  # one of Python's own in flight
    first_sight(h)
    for _ in range(3):
        h.publish()
    [item] = h.slow()  # the third would pass the limit with Python's one
    assert len(h.driver.launches) == 2 and h.engine.in_flight(h.counters[0]) == 2
    assert item[0] == native.SLOW_RECORD
    h.finish(item[2] - 1)
    assert eventually(lambda: h.engine.in_flight(h.counters[0]) == 0)  # given back once over


def test_serving_and_the_device_flag_stop_the_fast_path(harness: Harness) -> None:
    h = harness
    first_sight(h)
    h.engine.set_serving(False)
    h.engine.quiesce()
    seq = h.publish()
    [item] = h.slow()
    assert item[2] == seq and h.driver.launches == []
    h.engine.set_serving(True)
    h.engine.set_device_ok(0, False)
    h.engine.resume(1, seq + 1)
    seq = h.publish()
    [item] = h.slow()
    assert item[2] == seq and h.driver.launches == []


@pytest.mark.parametrize(
    "spoil",
    [
        lambda raw: raw[:8] + (2).to_bytes(2, "little") + raw[10:],  # another kind
        lambda raw: raw[:10] + (4).to_bytes(2, "little") + raw[12:],  # an unknown flag
        lambda raw: (99).to_bytes(8, "little") + raw[8:],  # a lying seq
    ],
    ids=["kind", "flags", "seq"],
)
def test_a_record_unlike_its_ticket_goes_to_python(
    harness: Harness, spoil: Callable[[bytes], bytes]
) -> None:
    h = harness
    first_sight(h)
    seq = h.client.head
    at = layout.HEADER_SIZE + (seq % h.client.slots) * layout.SLOT_SIZE
    raw = bytes(h.memory.record(seq - 1))
    h.client._map[at : at + layout.SLOT_SIZE] = spoil(seq.to_bytes(8, "little") + raw[8:])
    h.client._publish()
    [item] = h.slow()
    assert item[2] == seq and h.driver.launches == []


def test_a_head_past_the_ring_breaks_it_off(harness: Harness) -> None:
    h = harness
    h.memory.set_u64(layout.HEAD, 10_000)
    [item] = h.slow()
    assert item[:3] == (native.SLOW_BROKEN, 1, 0)
    time.sleep(0.02)
    assert h.engine.take_slow(0.0) == []  # nothing more of it is taken


def test_a_failed_launch_and_a_failed_event_are_told_with_their_session(harness: Harness) -> None:
    h = harness
    first_sight(h)
    h.driver.fail_launch = 700
    seq = h.publish()
    [item] = h.slow()
    assert item == (native.SLOW_LAUNCH_FAILED, 1, seq, 700, TOKEN)
    h.engine.resume(1, seq + 1)  # Python wrote its entry
    good = h.publish()
    h.driver.fail_query = 719
    h.finish(good)
    [fault] = h.slow()
    assert fault[0] == native.SLOW_FAULT and fault[3:] == (719, TOKEN)
    done = h.client.done
    time.sleep(0.02)
    assert h.client.done == done  # its done waits for Python's word: the entry comes first
    h.engine.fault_done(1)
    assert eventually(lambda: h.client.done == good + 1)


def test_the_ring_wraps_and_records_stay_in_order() -> None:
    h = Harness(slots=8)
    try:
        h.finish(first_sight(h))
        for _ in range(50):  # more than the ring holds: each waits for the one before
            h.finish(h.publish())
        assert eventually(lambda: h.client.done == 51)
        assert len(h.driver.launches) == 50
    finally:
        h.close()


@pytest.mark.parametrize("notify_always", [False, True])
def test_a_sleeping_client_is_woken_and_a_stream_ring_always(notify_always: bool) -> None:
    h = Harness(notify_always=notify_always)
    try:
        first_sight(h)
        h.memory.set_u32(layout.CLIENT_WAITS, 0 if notify_always else 1)
        h.memory.drain_complete()
        h.finish(h.publish())
        assert eventually(lambda: h.client.done == 2)
        assert os.eventfd_read(h.memory.complete_fd) >= 1
    finally:
        h.close()


def ticket_each(
    engine: native.Engine, rings: list[RingMemory], clients: list[Ring], fixed: bytes
) -> None:
    """Each ring's first launch decided as Python would (ring ids from 1): resumed past it
    with a ticket for it, on a stream of its own, so the next ones are the engine's."""
    for index, client in enumerate(clients, 1):
        seq = client.launch_fixed(fixed, SCALARS, (4, 1.0), False, 1.0)
        items: list[tuple[int, int, int, int, int]] = []
        while not items:
            items = engine.take_slow(1.0)
        key = bytes(rings[index - 1].record(seq)[12:148])
        stream = STREAM + index
        engine.resume(index, 1, [(0, stream, index)], [(key, 0, EXEC, stream, index, 0, 0)])


def test_several_threads_share_the_rings() -> None:
    driver = FakeDriver()
    engine = native.Engine(threads=3, spin_ns=20_000, flight_spin_ns=0)
    engine.set_driver(0, "table", **driver.table())
    rings = [RingMemory(16) for _ in range(6)]
    clients = [Ring(*[os.dup(fd) for fd in m.fds()]) for m in rings]
    for index, memory in enumerate(rings, 1):
        engine.add_ring(index, memory.map, 16, memory.submit_fd, memory.complete_fd, (NONE, NONE))
    engine.start()
    try:
        fixed = Ring.fixed_part(1, [2], [3], 2)
        ticket_each(engine, rings, clients, fixed)
        for client in clients:
            for _ in range(10):
                client.launch_fixed(fixed, SCALARS, (4, 1.0), False, 1.0)
        assert eventually(lambda: len(driver.launches) == 60)
        assert eventually(lambda: all(c.taken == 11 for c in clients))
        driver.finish_all()
        assert eventually(lambda: all(c.done == 11 for c in clients))
        assert engine.stats()["threads"] == 3
    finally:
        for index in range(1, 7):
            engine.remove_ring(index)
        engine.stop()
        for client, memory in zip(clients, rings, strict=True):
            client.close()
            memory.close()
    assert driver.live_events == set()  # every pooled event destroyed


@pytest.mark.parametrize("timings", [False, True])
def test_the_engine_counts_its_driver_calls_and_times_them_when_asked(timings: bool) -> None:
    h = Harness(timings=timings)
    try:
        first_sight(h)
        run = [h.publish() for _ in range(5)]
        assert eventually(lambda: len(h.driver.launches) == 5)
        h.finish(run[-1])
        assert eventually(lambda: h.client.done == run[-1] + 1)
        stats = h.engine.stats()
        calls, took = stats["calls"], stats["call_ns"]
        assert calls["launch"] == 5 and calls["record"] >= 1 and calls["query_ready"] >= 1
        assert (
            set(calls) == set(took) == {"launch", "record", "query", "query_ready", "wake", "patch"}
        )
        assert (took["launch"] > 0 and took["query_ready"] > 0) is timings
        assert timings or not any(took.values())
    finally:
        h.close()


class Lanes:
    """Three lanes, one thread always running, over ``count`` rings of 64 slots (ids from 1),
    each ring's first launch decided (``ticket_each``); ``before_start`` sees the engine
    with its rings added, not yet started."""

    def __init__(self, count: int, before_start: Callable[[native.Engine], None]) -> None:
        self.driver = FakeDriver()
        self.engine = native.Engine(threads=3, base=1, spin_ns=20_000, flight_spin_ns=0)
        self.engine.set_driver(0, "table", **self.driver.table())
        self.rings = [RingMemory(64) for _ in range(count)]
        self.clients = [Ring(*[os.dup(fd) for fd in m.fds()]) for m in self.rings]
        for index, memory in enumerate(self.rings, 1):
            self.engine.add_ring(
                index, memory.map, 64, memory.submit_fd, memory.complete_fd, (NONE, NONE)
            )
        before_start(self.engine)
        self.engine.start()
        self.fixed = Ring.fixed_part(1, [2], [3], 2)
        ticket_each(self.engine, self.rings, self.clients, self.fixed)

    def launch(self, client: Ring) -> None:
        client.launch_fixed(self.fixed, SCALARS, (4, 1.0), False, 1.0)

    def close(self) -> None:
        """Every ring removed (the lanes then hold none), the engine stopped, rings closed."""
        for index in range(1, len(self.rings) + 1):
            self.engine.remove_ring(index)
        assert self.engine.stats()["rings_per_lane"] == [0, 0, 0]
        self.engine.stop()
        for client, memory in zip(self.clients, self.rings, strict=True):
            client.close()
            memory.close()


def test_rings_spread_over_every_lane_and_are_served_crowded_or_not() -> None:
    """Three lanes, one thread always running: it serves all three until the engine is told
    of a crowd, then each lane's own thread serves it; launches go on through every flip."""

    def spread_evenly(engine: native.Engine) -> None:
        assert engine.stats()["rings_per_lane"] == [2, 2, 2] and not engine.crowded

    lanes = Lanes(6, spread_evenly)
    driver, engine, clients = lanes.driver, lanes.engine, lanes.clients
    try:
        launched = 0
        for flip in range(8):
            engine.crowded = flip % 2 == 1
            for client in clients:
                lanes.launch(client)
                launched += 1
            assert eventually(lambda: len(driver.launches) == launched, 30.0)  # noqa: B023
            want = 1 + launched // len(clients)
            # Taken means each launch's event is recorded: finishing before that would leave
            # an event the fake driver never finishes (the engine records after launching).
            assert eventually(lambda: all(c.taken == want for c in clients), 30.0)  # noqa: B023
            driver.finish_all()
            # Generous: under a sanitizer on a busy 2-CPU machine a round can take long.
            assert eventually(lambda: all(c.done == want for c in clients), 30.0), (  # noqa: B023
                flip,
                [c.done for c in clients],
            )
        assert engine.crowded  # the last flip
        engine.quiesce()  # a barrier on every lane, whoever serves it
    finally:
        lanes.close()
    assert driver.live_events == set()
    with pytest.raises(ValueError, match="base must be"):
        native.Engine(threads=2, base=3)


def test_only_a_crowd_that_waits_for_its_launches_gets_every_lane_its_own_thread() -> None:
    """Told of a crowd, the engine gives each lane its own thread while the clients wait for
    their launches (woken about once a launch); a crowd that pipelines (launches nobody is
    woken for) goes back to the base threads, where the driver's launch path contends
    less; and a crowd no more is served by the base threads whatever its use."""

    def judged_nothing(engine: native.Engine) -> None:
        stats = engine.stats()
        assert not stats["spread"] and not stats["pipelined"]

    lanes = Lanes(2, judged_nothing)
    driver, engine, clients = lanes.driver, lanes.engine, lanes.clients

    def launch_until(judged: Callable[[dict[str, object]], bool], each: int) -> bool:
        """Launches ``each`` at a time on every ring, each batch run to its end, until the
        engine's stats say ``judged`` (at most 10 s)."""
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            want = clients[0].head + each  # not taken: the first sight's resume may lag
            for client in clients:
                for _ in range(each):
                    lanes.launch(client)
            assert eventually(lambda: all(c.taken == want for c in clients), 30.0)  # noqa: B023
            driver.finish_all()
            assert eventually(lambda: all(c.done == want for c in clients), 30.0)  # noqa: B023
            if judged(engine.stats()):
                return True
        return False

    try:
        engine.crowded = True
        assert engine.stats()["spread"]  # nothing judged against it yet
        assert launch_until(lambda s: bool(s["pipelined"]) and not s["spread"], each=32)
        for memory in lanes.rings:  # the clients now sleep in every wait: woken once a launch
            memory.set_u32(layout.CLIENT_WAITS, 1)
        assert launch_until(lambda s: not s["pipelined"] and bool(s["spread"]), each=1)
        assert engine.stats()["calls"]["wake"] > 0
        engine.crowded = False
        assert not engine.stats()["spread"] and engine.crowded is False
        engine.quiesce()
    finally:
        lanes.close()
    assert driver.live_events == set()


def test_a_removed_ring_is_let_go_and_its_memory_closes() -> None:
    h = Harness()
    first_sight(h)
    with pytest.raises(BufferError):
        h.memory.map.close()  # held by the engine until it lets it go
    h.engine.remove_ring(1)
    h.memory.close()
    h.engine.stop()
    h.client.close()


def test_bad_arguments_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="threads"):
        native.Engine(threads=0)
    engine = native.Engine()
    with pytest.raises(ValueError, match="five functions"):
        engine.set_driver(0, "table", launch=1)
    with pytest.raises(ValueError, match="unknown driver kind"):
        engine.set_driver(0, "opencl")
    memory = RingMemory(8)
    try:
        with pytest.raises(ValueError, match="power of two"):
            engine.add_ring(1, memory.map, 6, memory.submit_fd, memory.complete_fd, (0, 0))
        with pytest.raises(ValueError, match="smaller"):
            engine.add_ring(1, bytearray(64), 8, memory.submit_fd, memory.complete_fd, (0, 0))
        with pytest.raises(KeyError):
            engine.resume(42, 1)
        with pytest.raises(IndexError):
            engine.bump(1 << 30)
    finally:
        engine.stop()
        memory.close()


def test_a_busy_ring_does_not_starve_one_that_went_idle() -> None:
    """A ring off the active list (its client idle past the spin) is taken again at its next
    record even while another ring keeps the engine busy the whole time."""
    busy = Harness()
    try:
        first_sight(busy)
        quiet = RingMemory(64)
        client = Ring(*[os.dup(fd) for fd in quiet.fds()])
        busy.engine.add_ring(2, quiet.map, 64, quiet.submit_fd, quiet.complete_fd, (NONE, NONE))
        fixed = Ring.fixed_part(5, [6], [7], 2)
        seq = client.launch_fixed(fixed, SCALARS, (4, 1.0), False, 1.0)
        [item] = busy.slow()
        assert item[:3] == (native.SLOW_RECORD, 2, seq)
        key = bytes(quiet.record(seq)[12:148])
        busy.engine.resume(2, 1, [(0, 1, 1)], [(key, 0, 9, 1, 1, 1, busy.engine.epoch(1))])
        assert eventually(lambda: client.taken == 1)
        busy.driver.finish_all()
        assert eventually(lambda: quiet.u32(layout.DAEMON_WAITS) == 1)  # off the list now
        stop = time.monotonic() + 1.0
        later = None
        while time.monotonic() < stop:  # the busy ring never lets the engine rest
            busy.finish(busy.publish())
            if later is None and time.monotonic() > stop - 0.8:
                later = client.launch_fixed(fixed, SCALARS, (4, 1.0), False, 1.0)
                published = time.monotonic()
            if later is not None and client.taken > later:
                break
        assert later is not None and client.taken > later
        assert time.monotonic() - published < 0.05  # within a few milliseconds, not starved
    finally:
        busy.engine.remove_ring(2)
        busy.close()
        client.close()
        quiet.close()


def test_a_record_whose_end_cannot_be_recorded_holds_done_for_pythons_word(
    harness: Harness,
) -> None:
    """Python launched a record; the device then fails the event that would end it: the
    engine says so, and ``done`` does not pass the record before Python wrote its entry."""
    h = harness
    seq = h.publish()
    [item] = h.slow()
    h.driver.fail_record = 719
    h.engine.resume(1, seq + 1, [(0, STREAM, TOKEN)])
    [failed] = h.slow()
    assert failed == (native.SLOW_LAUNCH_FAILED, 1, seq, 719, TOKEN)
    time.sleep(0.05)
    assert h.client.done == 0  # held: the entry comes first
    h.engine.resume(1, seq + 1)  # Python wrote it
    assert eventually(lambda: h.client.done == seq + 1)
    assert item[2] == seq


def test_a_crowd_spreads_new_rings_over_the_crowd_threads_only_when_asked() -> None:
    from accyd.ring.engine.auto import open_engine
    from accyd.ring.engine.native import NativeEngine
    from tests.core.daemon_fixtures import host_daemon

    daemon, _ = host_daemon()
    engines = []
    try:
        spread = open_engine(daemon, kind="native", threads=2, crowd_threads=4)
        engines.append(spread)
        assert isinstance(spread, NativeEngine)
        assert (spread.threads, spread.max_threads) == (2, 4)
        assert spread.stats()["threads"] == 4
        spread.crowded(True)
        assert spread._engine.crowded
        spread.crowded(False)
        assert not spread._engine.crowded
        spread.close()
        plain = open_engine(daemon, kind="native", threads=2)  # the default: no spreading
        engines.append(plain)
        plain.crowded(True)
        assert plain.max_threads == 2 and plain.stats()["threads"] == 2
    finally:
        for engine in engines:
            engine.close()
        daemon.close()
