"""How ring clients wait: the spin budget the daemon publishes, and the client reading it."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from accy._ring import Ring, wait_spin_seconds
from accy.protocol import ring as layout
from accyd.core.daemon import Daemon
from accyd.ring import RingDoor
from accyd.ring.engine.auto import open_engine
from accyd.ring.memory import RingMemory
from accyd.ring.waiting import FULL_SPIN_US, SHORT_SPIN_US, WaitBudget, spin_budget
from accyd.scheduling import DeviceWork
from tests.core.daemon_fixtures import host_daemon


@pytest.mark.parametrize(
    ("waiters", "cpus", "reserved", "budget"),
    [
        (1, 16, 5, FULL_SPIN_US),  # one client on a GPU node: spins as before
        (8, 16, 5, FULL_SPIN_US),  # eight: still (11 CPUs left over)
        (11, 16, 5, FULL_SPIN_US),
        (12, 16, 5, 0),  # one more than the CPUs left: every client sleeps at once
        (32, 16, 5, 0),
        (0, 16, 5, FULL_SPIN_US),
        (1, 2, 2, SHORT_SPIN_US),  # a small machine: one spinner is always allowed
        (2, 2, 2, 0),
        (8, 2, 2, 0),
        (3, 4, 1, SHORT_SPIN_US),
        (4, 4, 1, 0),
    ],
)
def test_clients_spin_only_while_they_fit_on_the_cpus_the_engine_leaves(
    waiters: int, cpus: int, reserved: int, budget: int
) -> None:
    assert spin_budget(waiters, cpus, reserved) == budget


def _published(memory: RingMemory) -> int | None:
    raw = memory.u32(layout.WAIT_SPIN)
    return raw & ~layout.SPIN_SET if raw & layout.SPIN_SET else None


def test_the_budget_is_published_into_every_ring_as_rings_come_and_go() -> None:
    budget = WaitBudget(reserved=2, cpus=4)  # two spinners fit
    rings = [RingMemory(64) for _ in range(3)]
    try:
        assert all(_published(memory) is None for memory in rings)  # nothing before attach
        budget.attach(rings[0])
        budget.attach(rings[1])
        assert [_published(m) for m in rings] == [SHORT_SPIN_US, SHORT_SPIN_US, None]
        budget.attach(rings[2])  # three: every one of them is told to sleep at once
        assert [_published(m) for m in rings] == [0, 0, 0] and budget.waiters == 3
        budget.detach(rings[2])
        budget.detach(rings[2])  # idempotent
        assert [_published(m) for m in rings[:2]] == [SHORT_SPIN_US, SHORT_SPIN_US]
        rings[1].close()
        budget.detach(rings[1])  # a closed ring is skipped, not written
        assert budget.waiters == 1 and _published(rings[0]) == SHORT_SPIN_US
    finally:
        for memory in rings:
            memory.close()


def test_the_engine_hears_when_the_waiting_clients_become_a_crowd_and_stop_being_one() -> None:
    heard: list[bool] = []
    budget = WaitBudget(reserved=3, cpus=5, on_crowded=heard.append)  # room for 2 spinners
    rings = [RingMemory(64) for _ in range(4)]
    try:
        budget.attach(rings[0])
        budget.attach(rings[1])
        assert heard == [] and not budget.crowded
        budget.attach(rings[2])
        budget.attach(rings[3])
        assert heard == [True] and budget.crowded  # told once, as the crowd formed
        budget.detach(rings[3])
        assert heard == [True]
        budget.detach(rings[2])
        assert heard == [True, False] and not budget.crowded
    finally:
        for memory in rings:
            memory.close()


def test_switched_off_it_publishes_nothing() -> None:
    heard: list[bool] = []
    budget = WaitBudget(reserved=2, cpus=2, enabled=False, on_crowded=heard.append)
    memory = RingMemory(64)
    try:
        budget.attach(memory)
        budget.attach(other := RingMemory(64))
        assert _published(memory) is None and budget.budget_us == 0
        assert heard == []  # nor does the engine hear of a crowd: its clients spin anyway
        other.close()
    finally:
        memory.close()


def _client_ring(memory: RingMemory) -> Ring:
    return Ring(*(os.dup(fd) for fd in memory.fds()))


def test_a_client_spins_for_the_lesser_of_the_published_budget_and_its_own() -> None:
    memory = RingMemory(64)
    ring = _client_ring(memory)
    try:
        own = wait_spin_seconds()
        assert ring.wait_spin() == own  # an older daemon publishes nothing: its own default
        memory.set_u32(layout.WAIT_SPIN, layout.SPIN_SET | 0)
        assert ring.wait_spin() == 0.0  # read at each wait, not once
        memory.set_u32(layout.WAIT_SPIN, layout.SPIN_SET | 50)
        assert ring.wait_spin() == pytest.approx(min(own, 50e-6))
        memory.set_u32(layout.WAIT_SPIN, layout.SPIN_SET | 100_000)
        assert ring.wait_spin() == own  # never longer than its own CPUs allow
    finally:
        ring.close()
        memory.close()


def test_a_client_told_not_to_spin_sleeps_at_once_and_still_wakes() -> None:
    """With budget 0 the wait goes straight to the eventfd: it says it sleeps
    (``client_waits``) before ``done`` moves, and the daemon's wake ends it."""
    memory = RingMemory(64)
    ring = _client_ring(memory)
    try:
        memory.set_u32(layout.WAIT_SPIN, layout.SPIN_SET | 0)
        ring.spin_seconds = 10.0  # its own default would spin far past the wake below

        def finish() -> None:
            while not memory.u32(layout.CLIENT_WAITS):
                pass
            memory.set_u64(layout.DONE, 1)
            memory.wake_client()

        waker = threading.Thread(target=finish)
        waker.start()
        ring.wait(0, 5.0)
        waker.join(5.0)
        assert not waker.is_alive()
    finally:
        ring.close()
        memory.close()


@pytest.fixture
def waiting_door(tmp_path: Path) -> Iterator[tuple[Daemon, RingDoor, WaitBudget]]:
    daemon, _ = host_daemon()
    engine = open_engine(daemon, kind="native")
    budget = WaitBudget(reserved=2, cpus=3)  # one spinner fits
    work = DeviceWork(2)
    ring_door = RingDoor(daemon, tmp_path / "accyd.sock", engine, work=work, waits=budget)
    daemon.extend(ring_door)
    engine.start()
    ring_door.start()
    try:
        yield daemon, ring_door, budget
    finally:
        ring_door.close()
        engine.close()
        daemon.close()
        work.close()


def test_the_door_tells_clients_how_to_wait_as_they_take_and_leave_rings(
    waiting_door: tuple[Daemon, RingDoor, WaitBudget],
) -> None:
    daemon, ring_door, budget = waiting_door
    first, second = daemon.attach("first").id, daemon.attach("second").id

    def take(client_id: str) -> Ring:
        offer = ring_door.offer(client_id, 64)
        return Ring.connect(ring_door.path, offer.ring_id, offer.ticket)

    one = take(first)
    try:
        assert one.wait_spin() == min(wait_spin_seconds(), SHORT_SPIN_US * 1e-6)
        offered = ring_door.offer(second, 64)  # offered, not taken: no client waits on it yet
        assert budget.waiters == 1
        two = Ring.connect(ring_door.path, offered.ring_id, offered.ticket)
        assert budget.waiters == 2 and one.wait_spin() == 0.0 and two.wait_spin() == 0.0
        daemon.detach(second)  # its rings go with it: the first may spin again
        assert budget.waiters == 1 and one.wait_spin() > 0.0
        two.close()
    finally:
        one.close()
    ring_door.close_client(first)
    assert budget.waiters == 0
