"""memtune: freed megabyte blocks stay in the daemon's heap for the next chunk."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from accyd.process.malloc import keep_freed_memory

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)

# Run in a child: the setting is process-wide and lasting. mallinfo2 (glibc 2.33+) tells
# how many bytes are mapped on their own (hblkhd) and how many lie free in the heap.
_MALLINFO = """
import ctypes, sys
from accyd.process.malloc import keep_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
"""
_PROBE = (
    _MALLINFO
    + """tuned = keep_freed_memory(int(sys.argv[1]))
block = bytearray(8 << 20)
mapped = libc.mallinfo2().hblkhd >= 8 << 20
del block
kept = libc.mallinfo2().fordblks >= 8 << 20
print(tuned, mapped, kept)
"""
)


def probe(keep_bytes: int) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(keep_bytes)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout.split()


def test_tuned_an_8_mib_block_comes_from_the_heap_and_stays_there_when_freed() -> None:
    assert probe(256 << 20) == ["True", "False", "True"]


def test_glibc_defaults_map_a_fresh_8_mib_block_and_hand_it_back() -> None:
    assert probe(0) == ["False", "True", "False"]


def test_zero_leaves_the_defaults() -> None:
    assert keep_freed_memory(0) is False


_THREADS = (
    _MALLINFO
    + """
import threading
keep_freed_memory(int(sys.argv[1]))
start = threading.Barrier(16)

def churn():
    start.wait()  # all at once: each may take an arena of its own
    for _ in range(20):
        blocks = [bytearray(6 << 20) for _ in range(3)]
        del blocks

threads = [threading.Thread(target=churn) for _ in range(16)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(libc.mallinfo2().fordblks)
"""
)


def test_what_is_kept_is_bounded_over_every_threads_arena() -> None:
    """16 threads churning 18 MiB each: the freed memory kept stays near ``keep_bytes`` in
    all, not ``keep_bytes`` per arena (the soak's RSS grew that way)."""
    keep = 32 << 20
    done = subprocess.run(
        [sys.executable, "-c", _THREADS, str(keep)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    kept = int(done.stdout.split()[-1])
    assert kept <= 2 * keep, f"{kept >> 20} MiB freed memory kept, for {keep >> 20} MiB asked"
