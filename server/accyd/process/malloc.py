"""glibc malloc settings for a process that moves data in megabyte chunks: reuse, don't churn.

Each chunk of a buffer read or write allocates and frees a few blocks of about
the chunk's size (the copy, the message, its encoding). With glibc's defaults
such blocks are mapped fresh from the kernel and given back, or the heap's top
is trimmed and grown again, so every chunk pays page faults and zeroing of new
pages: measured on the 2-core build machine, this halves a 64 MiB read (0.27-0.33
against 0.41-0.62 GiB/s with the settings below). Fixing the thresholds keeps
freed blocks below 32 MiB on the heap for reuse, and up to ``keep_bytes`` of
freed memory in the process rather than handed back.

glibc keeps that much per arena (each thread that allocates may get an arena of
its own, up to eight per core), so the arenas are capped at ``ARENAS`` and each
keeps its share of ``keep_bytes``: otherwise what is kept grows with every arena
that fills (the soak's slow RSS growth was freed memory kept this way; the
memory in use stayed flat), up to arenas times ``keep_bytes``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

__all__ = ["ARENAS", "MMAP_THRESHOLD_MAX", "keep_freed_memory", "trim_freed_memory"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
ARENAS = 4
"""The most malloc arenas the process uses once tuned (threads share them)."""
MMAP_THRESHOLD_MAX = 32 << 20
"""glibc's largest mmap threshold on 64-bit systems; blocks from this size up are mapped."""


def _libc() -> ctypes.CDLL | None:
    if platform.libc_ver()[0] != "glibc":
        return None
    name = ctypes.util.find_library("c")
    return None if name is None else ctypes.CDLL(name)


def trim_freed_memory() -> bool:
    """*Blocking* (milliseconds per GiB of heap): hand the kernel back the freed pages of
    every arena, also those amid blocks in use that the trim threshold never reaches
    (``malloc_trim(0)``); whether any went back. False off glibc."""
    libc = _libc()
    if libc is None:
        return False
    trim = libc.malloc_trim
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))


def keep_freed_memory(keep_bytes: int) -> bool:
    """Serve blocks below 32 MiB from the heap and keep up to ``keep_bytes`` freed, over at
    most ``ARENAS`` arenas.

    Process-wide and lasting; whether it took (False off glibc, or for 0,
    which leaves glibc's own adaptive settings).
    """
    libc = None if keep_bytes <= 0 else _libc()
    if libc is None:
        return False
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    keep = min(keep_bytes // ARENAS, 2**31 - 1)
    return (
        bool(mallopt(_M_ARENA_MAX, ARENAS))
        and bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX))
        and bool(mallopt(_M_TRIM_THRESHOLD, keep))
    )
