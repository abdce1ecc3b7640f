"""Device tickets mirrored from the engine's, against a stand-in launcher that records calls.

What a user relies on: a ticket Python checked before a revocation never launches after
it, and a device graph is freed only after the launcher was drained (nothing of it runs).
"""

from __future__ import annotations

from typing import Any

import pytest

from accyd.ring.engine.device_serving import DeviceServing
from accyd.ring.memory import RingMemory

KEY = bytes(range(136))


class Graph:
    def __init__(self, log: list[tuple[Any, ...]]) -> None:
        self.log = log
        self.closed = False

    def close(self) -> None:
        self.closed = True
        self.log.append(("close",))


class Launcher:
    """Records every call the way ``DeviceLauncher`` would take it."""

    failure = None

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.values = [0] * 8
        self.epochs = 0
        self.made = [0] * 8

    def attach(self, memory: object, slots: int) -> int:
        return 5

    def detach(self, slot: int) -> None:
        self.log.append(("detach", slot))

    def graph(self, slot: int, enqueue: object) -> Graph:
        return Graph(self.log)

    def new_epoch(self) -> int:
        self.epochs += 1
        return self.epochs - 1

    def epoch_value(self, epoch: int) -> int:
        self.log.append(("value", epoch))
        return self.values[epoch]

    def put_ticket(
        self, slot: int, key: bytes, graph: Graph, epoch: int, value: int, at: int
    ) -> int:
        self.log.append(("put", slot, epoch, value, at))
        return at

    def ticket_launches(self, slot: int) -> list[int]:
        return list(self.made)

    def drop_ticket(self, slot: int, at: int, *, barrier: bool = True) -> None:
        self.log.append(("drop", slot, at, barrier))

    def revoke(self, epochs: list[int]) -> None:
        for epoch in epochs:
            self.values[epoch] += 1
        self.log.append(("revoke", tuple(epochs)))

    def drain(self) -> None:
        self.log.append(("drain",))

    def stats(self) -> dict[str, int]:
        return {"launched": 0}

    def close(self) -> None:
        self.log.append(("launcher closed",))


class Launch:
    device_launchable = True

    def enqueue(self, stream: object) -> None:
        raise AssertionError("captured by the launcher, not here")


@pytest.fixture
def serving() -> Any:
    memory = RingMemory(16)
    launcher = Launcher()
    served = DeviceServing(0, None, launcher)
    assert served.attach(1, memory, "client")
    yield served, launcher
    served.close()
    memory.close()


def test_a_ticket_mirrors_the_engines_with_the_device_value_read_first(serving: Any) -> None:
    served, launcher = serving
    engine_epochs = {3: 7}

    def current(epoch: int) -> int:
        launcher.log.append(("engine", epoch))
        return engine_epochs[epoch]

    assert served.put(1, KEY, Launch(), 3, 7, current)
    kinds = [entry[0] for entry in launcher.log]
    assert kinds.index("value") < kinds.index("engine") < kinds.index("put")
    assert ("put", 5, 0, 0, 0) in launcher.log


def test_the_gpus_launches_are_counted_for_their_session_once(serving: Any) -> None:
    served, launcher = serving
    assert served.launches() == {}
    assert served.put(1, KEY, Launch(), 3, 7, lambda epoch: 7, "session-a")
    launcher.made[0] = 5
    assert served.launches() == {("client", "session-a"): 5}
    assert served.launches() == {}  # counted once
    launcher.made[0] = 9
    assert served.launches() == {("client", "session-a"): 4}


def test_a_ticket_revoked_since_python_checked_it_is_not_put(serving: Any) -> None:
    served, launcher = serving
    assert not served.put(1, KEY, Launch(), 3, 7, lambda epoch: 8)  # the engine bumped it
    assert not [entry for entry in launcher.log if entry[0] == "put"]


def test_work_in_an_sm_partition_or_an_unserved_ring_gets_no_device_ticket(serving: Any) -> None:
    served, _ = serving
    partitioned = Launch()
    partitioned.device_launchable = False
    assert not served.put(1, KEY, partitioned, 3, 7, lambda epoch: 7)
    assert not served.put(2, KEY, Launch(), 3, 7, lambda epoch: 7)


def test_revoking_drains_the_launcher_before_the_graph_is_freed(serving: Any) -> None:
    served, launcher = serving
    assert served.put(1, KEY, Launch(), 3, 7, lambda epoch: 7)
    launcher.log.clear()
    served.revoke([9])  # no device ticket checked against it: nothing to do
    assert launcher.log == []
    served.revoke([3])
    kinds = [entry[0] for entry in launcher.log]
    assert kinds[:2] == ["revoke", "drain"] and "close" in kinds
    assert kinds.index("drain") < kinds.index("close")
    launcher.log.clear()
    served.revoke([3])  # its ticket is gone: the device epoch is still bumped, nothing freed
    assert [entry[0] for entry in launcher.log] == ["revoke"]


def test_unbind_and_stopping_clear_the_rings_tickets_after_a_barrier_and_a_drain(
    serving: Any,
) -> None:
    served, launcher = serving
    assert served.put(1, KEY, Launch(), 3, 7, lambda epoch: 7)
    launcher.log.clear()
    served.stop_launching()
    assert launcher.log == [
        ("drop", 5, 0, False),
        ("drop", 5, 0, True),
        ("drain",),
        ("close",),
    ]
    launcher.log.clear()
    served.clear(1)  # nothing left to clear
    assert launcher.log == []
