"""Which rings the GPU serves, and handing a ring between the engine and the device launcher.

``--device-launch``: ``always`` serves every servable ring from the device; ``crowd`` only
while the rings' clients are a crowd (more wait than fit on the CPUs the engine leaves:
``WaitBudget``), since with few clients the engine's launch is quicker than the device's
(its look over PCIe, then a device graph launch) and with many it is the CPUs that run out;
``off`` never. A ring is *servable* where its client asked for device waits and its tenant
runs on the whole device with no in-flight quota.

The launcher serves one record of a ring at a time, so a client that pipelines (launches
without waiting, and waits every so often) is served better by the engine, which keeps its
records in flight on the session's stream. A served ring whose client is seen two or more
records ahead of ``done`` at ``PIPELINED_LOOKS`` looks in a row (``DEPTH_LOOK_SECONDS`` apart)
goes back to the engine for ``PIPELINED_SECONDS``; then the policy may hand it to the device
again.

Handing a ring over (on the engine's slow thread, ``switch``):

- *to the device*: the engine stops taking the ring's records only when it is quiet (none in
  flight, none with Python: ``set_device`` refuses otherwise, and it is asked again later),
  so every record before its tail is over; then the launcher watches it from ``done``, with
  the engine tickets Python made for it mirrored as device tickets;
- *back to the engine*: the launcher stops watching it and is drained (nothing it launched
  still runs), then the engine goes on from ``done``.

Either way its client is told (``SPIN_DEVICE`` in the ring's ``wait_spin``, through
``on_served``) and woken once, in case it sleeps where nothing would wake it. A launcher that
failed hands every ring back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import structlog

from accy.protocol import ring as layout
from accyd.backends.base import BackendKind
from accyd.core.interface import Core
from accyd.ring.memory import RingMemory
from accyd.ring.ring import ServerRing

if TYPE_CHECKING:  # neither is imported where the engine is not built or not asked for
    from accyd.ring.engine import _native
    from accyd.ring.engine.device_serving import DeviceServing

__all__ = ["DeviceLaunch", "DeviceRings", "Served"]

log = structlog.get_logger("accyd.ring.engine")

DeviceLaunch = Literal["off", "crowd", "always"]
TICKETS_KEPT = 1024
"""The engine tickets kept per ring for mirroring (the engine's own table holds as many)."""

PIPELINED_LOOKS = 2
"""Housekeeping looks in a row that see a served ring's client two or more records ahead of
``done`` before the engine takes the ring back (one look may catch a bind beside a launch)."""
DEPTH_LOOK_SECONDS = 0.05
"""How often served rings are looked at for pipelining (``switch`` runs after every batch of
slow records too: a burst of binds the launcher left would otherwise look deep twice)."""
PIPELINED_SECONDS = 5.0
"""How long a ring that pipelined stays with the engine before the device may serve it again
(a hand-over drains the launcher: not to be done at every look)."""

Served = Callable[[RingMemory, bool], None]
"""Told whether the GPU serves a ring now (``WaitBudget.set_device``)."""


@dataclass(eq=False, slots=True)
class _Servable:
    ring: ServerRing
    tickets: dict[bytes, tuple[Any, str]] = field(default_factory=dict)
    """The engine tickets Python made for the ring: key -> (fast launch, session id)."""
    deep: int = 0
    """Looks in a row that saw its client pipelining while the device served it."""
    engine_until: float = 0.0
    """It pipelined: the engine keeps it until then (``time.monotonic``); 0: no hold."""


class DeviceRings:
    """The device launcher's part in a native engine (``device_serving``), and the policy of
    which rings it serves. Owns the ``DeviceServing`` (closed by ``close``)."""

    def __init__(
        self,
        engine: _native.Engine,
        core: Core,
        mode: DeviceLaunch,
        serving: DeviceServing | None = None,
    ) -> None:
        """``serving``: one made already (the tests'); else the first CUDA device's."""
        self._engine = engine
        self.mode = mode
        self.serving = serving if serving is not None else _device_serving(core)
        self.on_served: Served | None = None
        self._crowd = False
        self._failed = False
        self._lock = threading.RLock()
        """Held while a ring is handed over or let go."""
        self._rings: dict[int, _Servable] = {}
        self._pending = False
        """Some ring is not where the policy wants it: ``switch`` looks again."""
        self._next_depth_look = 0.0

    # What the engine tells it ----------------------------------------------------------------

    @property
    def wanted(self) -> bool:
        """Whether servable rings belong to the device now."""
        if self.serving is None or self._failed:
            return False
        return self.mode == "always" or (self.mode == "crowd" and self._crowd)

    def crowded(self, crowded: bool) -> None:
        if crowded != self._crowd:
            self._crowd = crowded
            self._pending = True

    def added(self, index: int, ring: ServerRing, servable: bool) -> bool:
        """Ring ``index`` was taken; whether the device serves it from the start (it is
        quiet: nothing of it was taken yet)."""
        if not servable or self.serving is None:
            return False
        with self._lock:
            self._rings[index] = _Servable(ring)
            served = self.wanted and self.serving.attach(index, ring.memory, ring.client_id)
            ring.device_served = served
            return served

    def removed(self, index: int) -> None:
        """Ring ``index`` was let go by the engine: the launcher lets it go too."""
        with self._lock:
            held = self._rings.pop(index, None)
            if held is not None and held.ring.device_served and self.serving is not None:
                self.serving.detach(index)
                held.ring.device_served = False

    def ticket(self, index: int, key: bytes, fast: Any, session_id: str) -> None:
        """Python made an engine ticket for ring ``index``: kept for a hand-over, and put as
        a device ticket where the device serves the ring."""
        held = self._rings.get(index)
        if held is None or self.serving is None or fast.device != self.serving.device:
            return
        if len(held.tickets) >= TICKETS_KEPT:  # as the engine's table does
            held.tickets.clear()
        held.tickets[key] = (fast, session_id)
        if held.ring.device_served:
            self._put(index, key, fast, session_id)

    def cleared(self, index: int) -> None:
        """Ring ``index``'s handles were let go (UNBIND): its tickets with them."""
        held = self._rings.get(index)
        if held is None or self.serving is None:
            return
        held.tickets.clear()
        if held.ring.device_served:
            self.serving.clear(index)

    def revoke(self, epochs: Collection[int]) -> None:
        if self.serving is not None:
            self.serving.revoke(epochs)

    def watch(self, serving: bool, lost: Collection[int]) -> None:
        """The core's device state changed: where it stopped serving (draining) or the
        launcher's device was lost, no device ticket launches again."""
        if self.serving is None or (serving and self.serving.device not in lost):
            return
        try:
            self.serving.stop_launching()
        except Exception as error:  # a faulted device refuses the drain: nothing launches
            log.warning("the device launcher could not be drained", error=str(error))

    # Handing rings over (the engine's slow thread) --------------------------------------------

    def switch(self) -> None:
        """Hand over each ring that is not where the policy wants it (a busy ring is left for
        the next look)."""
        if self.serving is not None and self.serving.failure is not None and not self._failed:
            self._failed = self._pending = True
            log.error("the device launcher failed: its rings go back to the engine")
        now = time.monotonic()
        if now >= self._next_depth_look:
            self._next_depth_look = now + DEPTH_LOOK_SECONDS
            self._look_at_depth(now)
        if not self._pending:
            return
        want = self.wanted
        left = False
        with self._lock:
            for index, held in list(self._rings.items()):
                target = want and not held.engine_until
                if held.ring.device_served == target or held.ring.abandoned:
                    continue
                try:
                    moved = self._to_device(index, held) if target else self._to_engine(index, held)
                except Exception as error:
                    log.warning("a ring could not be handed over", index=index, error=str(error))
                    moved = False
                left = left or not moved
        self._pending = left

    def _look_at_depth(self, now: float) -> None:
        """Count the looks that see a served ring's client pipelining (``PIPELINED_LOOKS`` in
        a row: the engine takes it for ``PIPELINED_SECONDS``); end the holds that are over."""
        with self._lock:
            for held in self._rings.values():
                ring = held.ring
                if ring.abandoned:
                    continue
                if held.engine_until:
                    if now >= held.engine_until:
                        held.engine_until, self._pending = 0.0, True
                    continue
                if not ring.device_served:
                    continue
                try:
                    ahead = ring.memory.u64(layout.HEAD) - ring.memory.u64(layout.DONE)
                except ValueError:  # its memory closed as the client went
                    continue
                held.deep = held.deep + 1 if ahead >= 2 else 0
                if held.deep >= PIPELINED_LOOKS:
                    held.deep, held.engine_until = 0, now + PIPELINED_SECONDS
                    self._pending = True
                    log.debug("a served ring pipelines: the engine takes it", ring_id=ring.id)

    def _to_device(self, index: int, held: _Servable) -> bool:
        serving, ring = self.serving, held.ring
        assert serving is not None
        if not self._engine.set_device(index, True):
            return False  # busy: next time
        if not serving.attach(index, ring.memory, ring.client_id):
            self._engine.set_device(index, False)
            return True  # the launcher is full: the engine keeps it
        for key, (fast, session_id) in list(held.tickets.items()):
            self._put(index, key, fast, session_id)
        ring.device_served = True
        self._told(ring, True)
        return True

    def _to_engine(self, index: int, held: _Servable) -> bool:
        ring = held.ring
        assert self.serving is not None
        try:
            self.serving.detach(index)
        finally:  # a failed launcher launches nothing any more: the engine takes over anyway
            self._engine.set_device(index, False)
            ring.device_served = False
            self._told(ring, False)
        return True

    def _told(self, ring: ServerRing, served: bool) -> None:
        if self.on_served is not None:
            self.on_served(ring.memory, served)
        ring.memory.wake_client()  # a client asleep on ``complete`` looks again

    def _put(self, index: int, key: bytes, fast: Any, session_id: str) -> None:
        assert self.serving is not None
        launch, epoch, value = fast.launch, fast.epoch, fast.value
        self.serving.put(index, key, launch, epoch, value, self._engine.epoch, session_id)

    # Reporting and lifecycle ----------------------------------------------------------------

    def launches(self) -> dict[tuple[str, str], int]:
        return self.serving.launches() if self.serving is not None else {}

    def stats(self) -> dict[str, Any]:
        if self.serving is None:
            return {}
        with self._lock:
            served = sum(1 for held in self._rings.values() if held.ring.device_served)
        return {**self.serving.stats(), "mode": self.mode, "served_rings": served}

    def launched(self) -> int:
        return int(self.serving.stats().get("launched", 0)) if self.serving is not None else 0

    def close(self) -> None:
        if self.serving is not None:
            self.serving.close()


def _device_serving(core: Core) -> DeviceServing | None:
    """The device launcher of ``core``'s first CUDA device, or ``None`` (said once, why)."""
    cuda = [(d, b) for d, b in core.backends.items() if b.kind is BackendKind.CUDA]
    if not cuda:
        log.warning("device launch is off: no CUDA device here (the host backend serves)")
        return None
    device, backend = cuda[0]
    try:
        from accyd.ring.engine.device_serving import DeviceServing

        serving = DeviceServing(device, backend)
    except Exception as error:
        log.warning("device launch is off: the device launcher could not start", error=str(error))
        return None
    log.info("device launch is on: the GPU launches served rings' ticketed records", device=device)
    return serving
