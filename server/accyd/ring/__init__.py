"""The ring in one package: shared-memory launch queues handed to local clients (``door``),
the same ring carried over a stream (``stream``), and the engine that takes them all
(``engine``); it calls the core through ``accyd.core.interface.Core``."""

from accyd.ring.door import RingDoor, RingOffer

__all__ = ["RingDoor", "RingOffer"]
