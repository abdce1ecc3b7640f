"""The ring front door: offers rings to attached clients and hands them over a Unix socket.

A client asks for a ring over gRPC (authenticated like any call) and gets a
ring id and a one-time ticket; it takes the ring's memory and eventfds from the
handoff socket (``accyd.doors.hostmem.handoff``) beside the daemon's own socket. Containers
that share the socket's volume find the handoff socket beside the socket they
were given.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import structlog

from accyd.backends.base import Backend
from accyd.core.ids import new_id
from accyd.core.interface import Core
from accyd.doors.hostmem.handoff import OFFER_SECONDS, Handoff, Offered
from accyd.errors import InvalidRequest, QuotaExceeded, Unavailable
from accyd.ring.charges import RingCharges
from accyd.ring.copies import Copier
from accyd.ring.memory import RingMemory
from accyd.ring.observer import RingObserver
from accyd.ring.ring import ServerRing
from accyd.ring.waiting import WaitBudget
from accyd.scheduling import DeviceWork

__all__ = [
    "OFFER_SECONDS",
    "RINGS_PER_CLIENT",
    "RingDoor",
    "RingOffer",
    "RingTaker",
    "ring_slots",
]

log = structlog.get_logger("accyd.ring")

MAX_SLOTS = 4096
DEFAULT_SLOTS = 1024
RINGS_PER_CLIENT = 8
"""Rings one client may hold open or offered at once (each is up to a MiB of the daemon's
memory, and the submitter looks at every ring on each pass)."""


def ring_slots(asked: int) -> int:
    """The slots of a ring a client asked for (0: the default); refused unless a power of two
    up to ``MAX_SLOTS``."""
    slots = asked or DEFAULT_SLOTS
    if slots > MAX_SLOTS or slots & (slots - 1):
        raise InvalidRequest(
            f"slots must be a power of two up to {MAX_SLOTS}, not {slots}", field="slots"
        )
    return slots


class RingTaker(Protocol):
    """Who takes a ring's records once its client has it (``accyd.ring.engine``'s engines)."""

    def add(self, ring: ServerRing, *, notify_always: bool = False) -> None: ...

    def remove(self, ring: ServerRing) -> None: ...


@dataclass(frozen=True, slots=True)
class RingOffer:
    ring_id: str
    ticket: bytes
    handoff_name: str
    """The handoff socket's file name, in the folder of the socket the client dialled."""
    slots: int


class RingDoor:
    """Offers rings and hands them over the handoff socket; the engine takes (and owns) each
    ring once its client took it. The daemon closes a detached client's rings here first
    (``close_client``, as an extension of the core), so no record of theirs is taken after."""

    def __init__(
        self,
        core: Core,
        socket_path: Path,
        engine: RingTaker,
        *,
        work: DeviceWork,
        observer: RingObserver | None = None,
        waits: WaitBudget | None = None,
    ) -> None:
        self._core = core
        self.waits = waits
        """Tells each ring's client how long it may spin (``accyd.ring.waiting``)."""
        self._engine = engine
        self._observer = observer
        self._work = work
        self.handoff = Handoff(socket_path)
        """Shared with other things handed to clients (memory segments)."""
        self.path = self.handoff.path
        self.copier = Copier()
        """Runs rings' COPY records; copies nothing until ``copier.copies`` is set."""
        self._by_client: dict[str, dict[str, ServerRing]] = {}
        self._lock = threading.Lock()
        self.charges: RingCharges | None = None
        """Charges each ring to its tenant (``accyd.ring.charges``), once the server
        sets it."""

    def start(self, mode: int = 0o660) -> None:
        self.handoff.start(mode)

    def offer(self, client_id: str, slots: int = 0, *, device_waits: bool = False) -> RingOffer:
        """Make a ring for ``client_id``; it goes live once the client takes it.
        ``device_waits``: its client follows a device-served ring's wait, so the engine may
        let the GPU serve it."""
        if not self.handoff.open:
            raise Unavailable("the daemon is not offering rings now")
        slots = ring_slots(slots)
        memory = RingMemory(slots)
        ring = ServerRing(
            new_id("ring"),
            client_id,
            memory,
            self._core,
            self._work,
            self.copier,
            self._observer,
        )
        ring.device_waits = device_waits
        with self._lock:
            held = self._by_client.setdefault(client_id, {})
            if len(held) >= RINGS_PER_CLIENT:
                ring.close()
                raise QuotaExceeded(
                    f"client {client_id} has {len(held)} rings open or offered, the most one "
                    "client may have: launch on those (one per connection is enough)",
                    quota="rings_per_client",
                )
            held[ring.id] = ring
        if self.charges is not None:
            try:
                self.charges.charge(client_id, ring.id, slots)
            except BaseException:
                with self._lock:
                    held.pop(ring.id, None)
                ring.close()
                raise
        live = threading.Event()

        def taken() -> None:
            try:
                self._engine.add(ring)
            except Exception as error:  # its client detached meanwhile: it gets a closed ring
                log.info("ring not taken", ring_id=ring.id, client_id=client_id, error=str(error))
                ring.memory.mark_closed()
                return
            live.set()
            if self.waits is not None:
                self.waits.attach(ring.memory, device=ring.device_served)

        def gone() -> None:  # failed, refused or expired: never taken by the engine
            with self._lock:
                self._by_client.get(client_id, {}).pop(ring.id, None)
            self._let_go(ring)
            if live.is_set():
                self._engine.remove(ring)
            else:
                ring.close()
            if self.charges is not None:
                self.charges.refund(ring.id)

        ticket = self.handoff.offer(
            Offered(
                ring.id,
                client_id,
                memory.fds,
                # Live before the client hears of it, and under the offers' lock, so a
                # close_client that follows is queued after this add and finds the ring.
                taken=taken,
                failed=gone,
                dropped=gone,
            )
        )
        return RingOffer(ring.id, ticket, self.path.name, slots)

    def close_client(self, client_id: str) -> None:
        """Close every ring of a client that detached; returns once they are closed."""
        withdrawn = set(self.handoff.withdraw_client(client_id))
        with self._lock:
            rings = self._by_client.pop(client_id, {})
        for ring in rings.values():  # first, all at once: none of their records is decided now
            ring.abandon()
        for ring_id, ring in rings.items():
            self._let_go(ring)
            if ring_id in withdrawn:
                ring.close()
            else:
                self._engine.remove(ring)
        if self.charges is not None:
            self.charges.refund_client(client_id)

    def device_replaced(self, device: int, backend: Backend) -> None:
        """Nothing of the door's names a device (the engine hears of it itself)."""

    def close(self) -> None:
        """Stop taking rings and close them all; removes only our own handoff socket."""
        self.handoff.close()
        with self._lock:
            rings = [ring for held in self._by_client.values() for ring in held.values()]
            self._by_client.clear()
        for ring in rings:
            self._let_go(ring)
            self._engine.remove(ring)
        self.copier.close()

    def _let_go(self, ring: ServerRing) -> None:
        if self.waits is not None:
            self.waits.detach(ring.memory)
