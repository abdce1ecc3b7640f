"""Host-shared memory: segments the daemon makes, maps and hands to one client, and
buffers it hands to their owner to map with no copy."""

from accyd.shm.exports import ExportOffer
from accyd.shm.segments import SegmentOffer, Segments

__all__ = ["ExportOffer", "SegmentOffer", "Segments"]
