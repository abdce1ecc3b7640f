"""Host-shared memory: segments the daemon makes, maps and hands to one client, and
buffers it hands to their owner to map with no copy."""

from accyd.doors.hostmem.exports import ExportOffer
from accyd.doors.hostmem.segments import SegmentOffer, Segments

__all__ = ["ExportOffer", "SegmentOffer", "Segments"]
