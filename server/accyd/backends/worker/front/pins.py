"""The front's record of host memory a worker mapped too: which copies need not carry bytes.

``WorkerBackend.pin_host(memory, fd)`` has the worker map the file ``fd`` names
(a shared segment's memfd) and pin its own mapping. The front checks first,
from ``/proc/self/maps``, that ``memory`` really is that file mapped from offset
0 (a wrong ``fd`` would make every copy move the wrong bytes), then keeps the
mapping's address range here. A later copy whose host view lies wholly inside
one range names (pin id, offset, size) instead of sending its bytes.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import numpy as np

__all__ = [
    "FileIdentity",
    "PinnedRange",
    "PinnedRanges",
    "address_of",
    "file_identity",
    "maps_file",
]

MAPS = "/proc/self/maps"


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """What names one file across processes: its device and inode (and its size now)."""

    dev: int
    ino: int
    size: int


@dataclass(frozen=True, slots=True)
class PinnedRange:
    """``[base, end)`` of the front's address space, mapped and pinned by the worker as pin
    ``hid`` (``WorkerBackend.pin_host``'s token: ``unpin_host`` takes it back)."""

    hid: int
    base: int
    end: int


def file_identity(fd: int) -> FileIdentity:
    st = os.fstat(fd)
    return FileIdentity(st.st_dev, st.st_ino, st.st_size)


def address_of(view: memoryview) -> int:
    """The address of the first byte of a C-contiguous view (read-only views too)."""
    return int(np.frombuffer(view, np.uint8).ctypes.data)


def maps_file(base: int, size: int, identity: FileIdentity, maps: str = MAPS) -> bool:
    """Whether bytes ``base..base+size`` of this process are the file ``identity`` mapped
    shared from offset 0 (offset ``a - base`` at each address ``a``), one mapping or several
    adjoining ones (a mapping may be split), every byte of it."""
    major, minor = os.major(identity.dev), os.minor(identity.dev)
    end = base + size
    covered = base
    with open(maps, encoding="ascii", errors="replace") as lines:
        for line in lines:
            fields = line.split(maxsplit=5)
            if len(fields) < 5:
                continue
            start_text, _, stop_text = fields[0].partition("-")
            start, stop = int(start_text, 16), int(stop_text, 16)
            if stop <= covered:
                continue  # lines are in address order: skip those below `covered`
            if start > covered:
                return False  # a hole
            perms, offset, device, inode = fields[1], int(fields[2], 16), fields[3], fields[4]
            dev_major, _, dev_minor = device.partition(":")
            if (
                len(perms) < 4
                or perms[3] != "s"
                or int(dev_major, 16) != major
                or int(dev_minor, 16) != minor
                or int(inode) != identity.ino
                or offset != start - base
            ):
                return False
            covered = stop
            if covered >= end:
                return True
    return False


class PinnedRanges:
    """The worker's pinned mappings of one ``WorkerBackend``, by front address.

    Thread-safe: ``find`` runs on every copy without a lock (it reads a tuple that
    ``add``/``remove`` replace whole under one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ranges: tuple[PinnedRange, ...] = ()
        """Empty most of the time: copies then skip the address look-up."""

    def add(self, pinned: PinnedRange) -> None:
        with self._lock:
            self.ranges = (*self.ranges, pinned)

    def remove(self, pinned: PinnedRange) -> bool:
        """Forget ``pinned``; whether it was here (False: removed already)."""
        with self._lock:
            kept = tuple(r for r in self.ranges if r is not pinned)
            if len(kept) == len(self.ranges):
                return False
            self.ranges = kept
        return True

    def find(self, view: memoryview) -> tuple[int, int] | None:
        """(pin id, offset in its mapping) of a C-contiguous byte view wholly inside one
        range, else None. Call only with ``ranges`` non-empty (it costs an address look-up)."""
        size = view.nbytes
        if size == 0:
            return None
        address = address_of(view)
        for pinned in self.ranges:
            if pinned.base <= address and address + size <= pinned.end:
                return pinned.hid, address - pinned.base
        return None
