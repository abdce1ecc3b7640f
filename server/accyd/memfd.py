"""Sealed memfds: anonymous shared memory with no name, whose size no holder can change."""

from __future__ import annotations

import fcntl
import mmap
import os

__all__ = ["sealed_memfd"]


def sealed_memfd(name: str, size: int) -> tuple[int, mmap.mmap]:
    """A new memfd of ``size`` bytes, sealed against shrinking and growing, and its mapping.

    The caller owns both (close the mapping, then the descriptor). A process handed the
    descriptor can map it but cannot truncate it, so the daemon's own mapping never
    faults on a page cut away under it. ``name`` only labels it in ``/proc``.
    """
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(
            fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
        )
        return fd, mmap.mmap(fd, size)
    except BaseException:
        os.close(fd)
        raise
