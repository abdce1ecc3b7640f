"""What rings cost their tenants: the daemon's memory and descriptors each ring holds.

A shared ring is up to a MiB of the daemon's memory and four descriptors (its
memfd, the mapping's own, two eventfds); a ring over a stream is the memory
alone. Each is charged to its client's tenant when it is made
(``QuotaExceeded`` past the tenant's share or the daemon's ceiling, see
``accyd.core.limits``) and refunded when it goes: its offer dropped, its
client detached, its stream ended.
"""

from __future__ import annotations

import threading

from accy.protocol import ring as layout
from accyd.core.clients import Client
from accyd.core.interface import Core
from accyd.core.tenants import Usage

__all__ = ["RING_DESCRIPTORS", "RingCharges", "stream_ring_usage"]

RING_DESCRIPTORS = 4
"""A shared ring's descriptors in the daemon: the memfd, its mapping's, two eventfds."""


def shared_ring_usage(slots: int) -> Usage:
    return Usage(host_memory_bytes=layout.ring_bytes(slots), descriptors=RING_DESCRIPTORS)


def stream_ring_usage(slots: int) -> Usage:
    """What a ring over a stream of ``slots`` costs (the most a stream asks for, when the
    stream is charged before its first frame says)."""
    return Usage(host_memory_bytes=layout.ring_bytes(slots))


class RingCharges:
    """The charges of every shared ring, by ring id, until each is refunded once."""

    def __init__(self, daemon: Core) -> None:
        self._daemon = daemon
        self._held: dict[str, tuple[Client, Usage]] = {}
        self._lock = threading.Lock()

    def charge(self, client_id: str, ring_id: str, slots: int) -> None:
        """Charge a new ring of ``slots`` to its client's tenant, or raise ``QuotaExceeded``."""
        usage = shared_ring_usage(slots)
        client = self._daemon.charge(client_id, usage)
        with self._lock:
            self._held[ring_id] = (client, usage)

    def refund(self, ring_id: str) -> None:
        """Give a ring's charge back (once; nothing for a ring never charged)."""
        with self._lock:
            held = self._held.pop(ring_id, None)
        if held is not None:
            self._daemon.refund(*held)

    def refund_client(self, client_id: str) -> None:
        """Give back the charges of every ring of a client that detached."""
        with self._lock:
            ring_ids = [i for i, (client, _) in self._held.items() if client.id == client_id]
        for ring_id in ring_ids:
            self.refund(ring_id)
