"""Host-shared buffers: memory segments the daemon makes, maps and hands to one client."""

from accyd.shm.segments import SegmentOffer, Segments

__all__ = ["SegmentOffer", "Segments"]
