"""The ring front door: offers rings to attached clients and hands them over a Unix socket.

A client asks for a ring over gRPC (authenticated like any call) and gets a
ring id and a one-time ticket; it takes the ring's memory and eventfds from the
handoff socket (``accyd.handoff``) beside the daemon's own socket. Containers
that share the socket's volume find the handoff socket beside the socket they
were given.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import structlog

from accyd.backends.base import BackendKind
from accyd.core.ids import new_id
from accyd.errors import InvalidRequest, QuotaExceeded, Unavailable
from accyd.handoff import OFFER_SECONDS, Handoff, Offered
from accyd.ring.copies import Copier
from accyd.ring.memory import RingMemory
from accyd.ring.needs import RingObserver
from accyd.ring.ring import RingCore, ServerRing
from accyd.ring.submitter import FLIGHT_SPIN_SECONDS, Submitter

__all__ = [
    "OFFER_SECONDS",
    "RINGS_PER_CLIENT",
    "RingDoor",
    "RingOffer",
    "flight_spin_for",
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


def flight_spin_for(core: RingCore) -> float:
    """How long the submitter spins on launches in flight: a device runs them without this
    process, so spinning costs a core and finds their ends at once; the host backend runs
    them on Python threads, which need the GIL the spinning thread keeps taking back."""
    return 0.0 if core.backend.kind is BackendKind.HOST else FLIGHT_SPIN_SECONDS


@dataclass(frozen=True, slots=True)
class RingOffer:
    ring_id: str
    ticket: bytes
    handoff_name: str
    """The handoff socket's file name, in the folder of the socket the client dialled."""
    slots: int


class RingDoor:
    """Owns every ring (through its submitter) and the handoff socket they go out on."""

    def __init__(
        self,
        core: RingCore,
        socket_path: Path,
        *,
        submitter: Submitter | None = None,
        observer: RingObserver | None = None,
    ) -> None:
        self._core = core
        self._observer = observer
        self.handoff = Handoff(socket_path)
        """Shared with other things handed to clients (memory segments)."""
        self.path = self.handoff.path
        self._submitter = submitter or Submitter(flight_spin_seconds=flight_spin_for(core))
        self.copier = Copier()
        """Runs rings' COPY records; copies nothing until ``copier.copies`` is set."""
        self._by_client: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def start(self, mode: int = 0o660) -> None:
        self._submitter.start()
        self.handoff.start(mode)

    def offer(self, client_id: str, slots: int = 0) -> RingOffer:
        """Make a ring for ``client_id``; it goes live once the client takes it."""
        if not self.handoff.open:
            raise Unavailable("the daemon is not offering rings now")
        slots = ring_slots(slots)
        memory = RingMemory(slots)
        ring = ServerRing(
            new_id("ring"), client_id, memory, self._core, self.copier, self._observer
        )

        def dropped() -> None:
            with self._lock:
                self._by_client.get(client_id, set()).discard(ring.id)
            ring.close()

        with self._lock:
            held = self._by_client.setdefault(client_id, set())
            if len(held) >= RINGS_PER_CLIENT:
                ring.close()
                raise QuotaExceeded(
                    f"client {client_id} has {len(held)} rings open or offered, the most one "
                    "client may have: launch on those (one per connection is enough)",
                    quota="rings_per_client",
                )
            held.add(ring.id)
        ticket = self.handoff.offer(
            Offered(
                ring.id,
                client_id,
                memory.fds,
                # Live before the client hears of it, and under the offers' lock, so a
                # close_client that follows is queued after this add and finds the ring.
                taken=lambda: self._submitter.add(ring),
                failed=lambda: self._submitter.remove(ring.id),
                dropped=dropped,
            )
        )
        return RingOffer(ring.id, ticket, self.path.name, slots)

    def close_client(self, client_id: str, timeout: float = 5.0) -> None:
        """Close every ring of a client that detached; returns once they are closed."""
        withdrawn = set(self.handoff.withdraw_client(client_id))
        with self._lock:
            ring_ids = self._by_client.pop(client_id, set())
        events = []
        for ring_id in ring_ids - withdrawn:
            done = threading.Event()
            self._submitter.remove(ring_id, done)
            events.append(done)
        for done in events:
            done.wait(timeout)

    def close(self) -> None:
        """Stop taking rings and close them all; removes only our own handoff socket."""
        self.handoff.close()
        with self._lock:
            self._by_client.clear()
        self._submitter.stop()
        self.copier.close()
