"""The device launcher in the native engine: the rings it serves, and their device tickets.

A ring whose client asked for device waits (``OpenRingRequest.device_waits``), of a tenant
whose sessions run on the whole device with no in-flight quota, is *served* by the GPU:
the launcher (``backends/cuda/device_launcher.py``) launches each of its records that
matches a device ticket, and leaves the rest to the engine, which takes only those
(``_native.c``, ``device_left``). A device ticket mirrors an engine ticket: the same record
bytes, checked by Python against the same epoch, with a graph of the same pipeline that
ends by counting the ring's ``done`` up.

Epochs: each engine epoch a device ticket was checked against gets a device epoch of its
own (``_device_epoch``). A ticket's device value is read *before* the engine's epoch is
checked to still hold the value Python checked, and ``revoke`` bumps the engine's epochs
before the device's: so a ticket checked before a revocation is stale on both.

Ownership: this owns the ``DeviceLauncher`` (closed by ``close``, idempotent) and each device
graph it put in a ticket. A graph is freed only once nothing can launch it and no launch of
it still runs: after ``revoke`` of its epoch (which drains the launcher), ``clear`` of its
ring, or ``detach``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import structlog

from accyd.backends.cuda import launcher_source
from accyd.backends.cuda.device_launcher import DeviceLauncher
from accyd.backends.cuda.graphs import DeviceGraph
from accyd.errors import AccyError
from accyd.ring.memory import RingMemory

__all__ = ["DeviceServing"]

log = structlog.get_logger("accyd.ring.engine")


@dataclass(slots=True)
class _Place:
    key: bytes
    graph: DeviceGraph
    epoch: int
    """The engine's epoch the ticket was checked against."""
    session_id: str
    counted: int = 0
    """Its launches already reported (``launches``)."""


@dataclass(slots=True)
class _Served:
    slot: int
    client_id: str
    places: dict[int, _Place] = field(default_factory=dict)
    """Ticket index -> what it holds (live, unless its epoch was revoked since)."""


class DeviceServing:
    """One device's launcher and the rings it serves (see the module's docstring)."""

    def __init__(self, device: int, backend: Any, launcher: Any = None) -> None:
        """``launcher``: one made already (the tests' stand-in); else made on ``backend``."""
        self.device = device
        self._launcher = DeviceLauncher(backend) if launcher is None else launcher
        self._lock = threading.RLock()
        """Held by every change to the rings and their tickets (the engine's slow thread
        puts and clears, the core's threads revoke)."""
        self._served: dict[int, _Served] = {}
        """The engine's ring index -> its place in the launcher."""
        self._epochs: dict[int, int] = {}
        """The engine's epoch -> its device epoch."""
        self._closed = False

    # Rings -------------------------------------------------------------------------------

    def attach(self, index: int, memory: RingMemory, client_id: str) -> bool:
        """Serve ring ``index`` (of ``client_id``) from the device; False where the launcher
        serves as many rings as it can (the engine then takes it all)."""
        if self._launcher.failure is not None:
            return False
        try:
            slot = self._launcher.attach(memory.map, memory.slot_count)
        except AccyError as error:
            log.info("ring not served by the device", ring_index=index, reason=str(error))
            return False
        with self._lock:
            self._served[index] = _Served(slot, client_id)
        return True

    def detach(self, index: int) -> None:
        """Stop serving ring ``index`` and free its graphs, once none of them runs."""
        with self._lock:
            served = self._served.pop(index, None)
            if served is None:
                return
            self._launcher.detach(served.slot)
            for place in served.places.values():
                place.graph.close()

    # Tickets -----------------------------------------------------------------------------

    def put(
        self,
        index: int,
        key: bytes,
        launch: Any,
        epoch: int,
        value: int,
        current: Callable[[int], int],
        session_id: str = "",
    ) -> bool:
        """Mirror the engine's new ticket of ring ``index`` (``key``, a ``GraphLaunch`` of
        ``session_id`` checked against ``epoch`` at ``value``; ``current`` reads an engine
        epoch now) as a device ticket; False where it cannot be one (the ring is not served,
        the launch runs in an SM partition, no place is free): the engine's ticket then
        serves it."""
        with self._lock:
            served = None if self._closed else self._served.get(index)
            if served is None or not getattr(launch, "device_launchable", False):
                return False
            device_epoch = self._device_epoch(epoch)
            if device_epoch is None:
                return False
            device_value = self._launcher.epoch_value(device_epoch)
            if current(epoch) != value:  # revoked since Python checked it: stale on both
                return False
            at = next((t for t, p in served.places.items() if p.key == key), None)
            if at is None:
                free = (t for t in range(launcher_source.TICKETS) if t not in served.places)
                at = next(free, None)
            if at is None:
                return False
            try:
                graph = self._launcher.graph(served.slot, launch.enqueue)
            except AccyError as error:  # not launchable from the device: the engine serves it
                log.info("no device ticket", ring_index=index, reason=str(error))
                return False
            old = served.places.get(at)
            if old is not None:  # the same key checked again: no launch may take the old graph
                self._launcher.drop_ticket(served.slot, at)
                self._launcher.drain()
                old.graph.close()
            self._launcher.put_ticket(served.slot, key, graph, device_epoch, device_value, at)
            served.places[at] = _Place(key, graph, epoch, session_id)
            return True

    def clear(self, index: int) -> None:
        """Ring ``index``'s handles were let go (UNBIND): none of its tickets launches again."""
        with self._lock:
            served = self._served.get(index)
            if self._closed or served is None or not served.places:
                return
            for at in served.places:
                self._launcher.drop_ticket(served.slot, at, barrier=False)
            self._launcher.drop_ticket(served.slot, next(iter(served.places)))  # the barrier
            self._launcher.drain()
            places, served.places = served.places, {}
            for place in places.values():
                place.graph.close()

    def stop_launching(self) -> None:
        """The daemon stopped serving (draining, or its device faulted): no device ticket
        launches again (every record then goes to the engine, which refuses it)."""
        with self._lock:
            for index in list(self._served):
                self.clear(index)

    def revoke(self, epochs: Collection[int]) -> None:
        """The engine bumped ``epochs``: bump their device epochs, then wait until nothing
        checked against them can launch and none of their graphs runs, and free those."""
        with self._lock:
            mirrored = [self._epochs[e] for e in epochs if e in self._epochs]
            if self._closed or not mirrored:  # closed: nothing launches any more
                return
            self._launcher.revoke(mirrored)
            gone = set(epochs)
            stale = [
                (served, at)
                for served in self._served.values()
                for at, place in served.places.items()
                if place.epoch in gone
            ]
            if not stale:
                return
            self._launcher.drain()
            for served, at in stale:
                place = served.places.pop(at)
                self._launcher.drop_ticket(served.slot, at, barrier=False)
                place.graph.close()

    def _device_epoch(self, epoch: int) -> int | None:
        with self._lock:
            device_epoch = self._epochs.get(epoch)
            if device_epoch is None:
                try:
                    device_epoch = self._epochs[epoch] = self._launcher.new_epoch()
                except AccyError:
                    return None
            return device_epoch

    # Reporting and lifecycle ------------------------------------------------------------------

    def launches(self) -> dict[tuple[str, str], int]:
        """Launches the GPU made since the last call, by (client id, session id): for the
        launch counts and the clients' liveness (a ring's records count as calls)."""
        counts: dict[tuple[str, str], int] = {}
        with self._lock:
            for served in self._served.values():
                if not served.places:
                    continue
                made = self._launcher.ticket_launches(served.slot)
                for at, place in served.places.items():
                    if made[at] != place.counted:
                        key = (served.client_id, place.session_id)
                        counts[key] = counts.get(key, 0) + (made[at] - place.counted) % (1 << 32)
                        place.counted = made[at]
        return counts

    def stats(self) -> dict[str, int]:
        """The launcher's counts (``DeviceLauncher.stats``); none once closed."""
        return {} if self._closed else self._launcher.stats()

    @property
    def failure(self) -> str | None:
        return self._launcher.failure

    def close(self) -> None:
        """Stop the launcher and free every graph (the rings were detached or are let go
        with it). Idempotent."""
        with self._lock:  # a revoke or put after this finds it closed
            if self._closed:
                return
            self._closed = True
            self._launcher.close()
            served, self._served = list(self._served.values()), {}
        for ring in served:
            for place in ring.places.values():
                place.graph.close()
