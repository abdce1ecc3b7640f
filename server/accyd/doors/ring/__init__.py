"""The same-host submission ring: shared-memory launch queues handed to local clients."""

from accyd.doors.ring.door import RingDoor, RingOffer

__all__ = ["RingDoor", "RingOffer"]
