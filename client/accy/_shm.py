"""Buffer writes and reads through memory shared with a daemon on the same host.

One ``SharedPool`` per link, made on the first large transfer to a local
daemon: segments the daemon made (``OpenSegment``), taken from its handoff
socket like a ring, mapped here and reused. A write copies the data into a
segment (none when the array already lives in one: ``Client.shared_array``)
and asks the daemon to copy it into the buffer on its transfer stream; a read
is the reverse. ``ACCY_SHM=0`` (or ``Client(shared_memory=False)``) keeps
transfers on gRPC; below ``SHM_THRESHOLD`` bytes gRPC is about as fast.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from accy import _handoff
from accy._connection import Connection
from accy._launching import ring_errors, ring_of, ring_timeout
from accy._link import Link
from accy._target import unix_socket_of
from accy.errors import AccyError, FailedPrecondition, Unimplemented
from accy.protocol.launch.v1 import launch_pb2 as pb

__all__ = ["SHM_ENV", "SHM_THRESHOLD", "Segment", "SharedPool", "pool_of"]

SHM_ENV = "ACCY_SHM"
SHM_THRESHOLD = 256 << 10
"""Transfers of at least this many bytes go through shared memory. Measured on the host
backend (2 busy cores, best of 7, write/read): 64 KiB 1.45/1.27 ms against gRPC's
2.29/1.47; 256 KiB 1.38/1.51 against 3.94/2.35; 4 MiB 3.15/2.85 against 21.98/10.63.
Below 256 KiB the gain is within the noise of the two extra calls."""
MIN_SEGMENT = 4 << 20
POOLED_SEGMENTS = 4
"""Idle segments a link keeps for reuse (the daemon pins each once: reuse is the point)."""

_opening = threading.Lock()


class Segment:
    """The client's mapping of one daemon segment, as bytes (``data``)."""

    def __init__(self, segment_id: str, fd: int, byte_size: int) -> None:
        try:
            if os.fstat(fd).st_size < byte_size:
                raise OSError("the segment is smaller than the daemon said")
            self._map = mmap.mmap(fd, byte_size)
        finally:
            os.close(fd)
        self.id = segment_id
        self.byte_size = byte_size
        self.data: np.ndarray[Any, np.dtype[np.uint8]] = np.frombuffer(self._map, dtype=np.uint8)
        self.address = int(self.data.ctypes.data)
        self.busy = False
        self.dedicated = False


def address_of(array: np.ndarray[Any, Any] | memoryview) -> tuple[int, int]:
    """Where a C-contiguous array's bytes start, and how many there are."""
    flat = np.frombuffer(array, dtype=np.uint8) if isinstance(array, memoryview) else array
    return int(flat.ctypes.data), int(flat.nbytes)


class SharedPool:
    """A link's segments: reused for transfers, or dedicated to one shared array."""

    def __init__(self, conn: Connection, link: Link, socket_path: Path) -> None:
        self._conn = conn
        self._link = link
        self._socket_path = socket_path
        self._lock = threading.Lock()
        self._segments: list[Segment] = []
        self.usable = True

    def open(self, byte_size: int, device: int, timeout: float | None) -> Segment:
        """A new segment of ``byte_size`` bytes from the daemon, mapped here."""
        request = pb.OpenSegmentRequest(byte_size=byte_size, device=device)
        offer = self._conn.call(self._conn.stub.OpenSegment, request, timeout, link=self._link)[0]
        path = self._socket_path.with_name(offer.handoff_name)
        try:
            (fd,) = _handoff.take(path, offer.segment_id, offer.ticket, 1)
            segment = Segment(offer.segment_id, fd, offer.byte_size)
        except (OSError, _handoff.HandoffRefused):
            self._close_remote(offer.segment_id)
            raise
        with self._lock:
            self._segments.append(segment)
        return segment

    @contextlib.contextmanager
    def lease(self, byte_size: int, device: int, timeout: float | None) -> Iterator[Segment]:
        """An idle segment of at least ``byte_size`` bytes for one transfer."""
        with self._lock:
            idle = [s for s in self._segments if not s.busy and not s.dedicated]
            fits = [s for s in idle if s.byte_size >= byte_size]
            segment = min(fits, key=lambda s: s.byte_size) if fits else None
            if segment is not None:
                segment.busy = True
            elif len(idle) >= POOLED_SEGMENTS:  # make room: the smallest idle goes
                dropped = min(idle, key=lambda s: s.byte_size)
                self._segments.remove(dropped)
                self._close_remote(dropped.id)
        if segment is None:
            size = max(MIN_SEGMENT, 1 << (byte_size - 1).bit_length())
            segment = self.open(size, device, timeout)
            segment.busy = True
        try:
            yield segment
        finally:
            segment.busy = False

    def dedicate(self, byte_size: int, device: int, timeout: float | None) -> Segment:
        segment = self.open(byte_size, device, timeout)
        segment.dedicated = True
        return segment

    def discard(self, segment_id: str) -> None:
        """A dedicated segment's array was collected: free it on the daemon."""
        with self._lock:
            self._segments = [s for s in self._segments if s.id != segment_id]
        self._close_remote(segment_id)

    def locate(self, data: np.ndarray[Any, Any] | memoryview) -> tuple[Segment, int] | None:
        """The dedicated segment ``data``'s bytes lie in, and where, if they do."""
        start, size = address_of(data)
        with self._lock:
            for segment in self._segments:
                at = start - segment.address
                if segment.dedicated and at >= 0 and at + size <= segment.byte_size:
                    return segment, at
        return None

    def copy(
        self,
        segment: Segment,
        segment_offset: int,
        buffer_id: str,
        buffer_offset: int,
        size: int,
        *,
        to_buffer: bool,
        timeout: float | None,
    ) -> int:
        ring, link = ring_of(self._conn, timeout)
        # A record, not a call: about 1 ms less a copy.
        if ring is not None and ring.copies and link is self._link:
            with ring_errors(self._conn, link, f"a copy with buffer {buffer_id}"):
                ring.copy(
                    segment.id,
                    segment_offset,
                    buffer_id,
                    buffer_offset,
                    size,
                    to_buffer=to_buffer,
                    timeout=ring_timeout(self._conn, timeout),
                )
            return size
        direction = pb.COPY_DIRECTION_TO_BUFFER if to_buffer else pb.COPY_DIRECTION_TO_SEGMENT
        request = pb.CopySegmentRequest(
            segment_id=segment.id,
            segment_offset=segment_offset,
            buffer_id=buffer_id,
            buffer_offset=buffer_offset,
            size=size,
            direction=direction,
        )
        answer = self._conn.call(self._conn.stub.CopySegment, request, timeout, link=self._link)
        return int(answer[0].bytes_copied)

    def _close_remote(self, segment_id: str) -> None:
        conn, link = self._conn, self._link
        if conn.closed or link.lost is not None:
            return
        request = pb.CloseSegmentRequest(segment_id=segment_id)
        conn.later(lambda: conn.call(conn.stub.CloseSegment, request, link=link))


def shm_wanted(conn: Connection) -> Path | None:
    """The daemon's socket path when large transfers should use shared memory, else ``None``."""
    if not conn.shared_memory or os.environ.get(SHM_ENV, "1") == "0":
        return None
    return unix_socket_of(conn.target)


def in_shared_array(conn: Connection, data: np.ndarray[Any, Any] | memoryview) -> bool:
    """Whether ``data`` lies in an array from ``Client.shared_array``: copied through shared
    memory at any size (no bytes over gRPC, and through the ring a record, not a call)."""
    link = conn.link
    pool = None if link is None else link.shm
    return isinstance(pool, SharedPool) and pool.usable and pool.locate(data) is not None


def pool_of(conn: Connection, link: Link) -> SharedPool | None:
    """The link's pool (made on first use), or ``None`` where transfers stay on gRPC."""
    if not link.shm_tried:
        with _opening:
            if not link.shm_tried:
                path = shm_wanted(conn)
                link.shm = None if path is None else SharedPool(conn, link, path)
                link.shm_tried = True
    pool = link.shm
    return pool if isinstance(pool, SharedPool) and pool.usable else None


def refused(pool: SharedPool, error: AccyError | OSError | _handoff.HandoffRefused) -> bool:
    """Whether ``error`` says this daemon shares no memory (then the pool is given up): it
    serves no Unix socket, predates shared memory, or the handoff failed."""
    if isinstance(error, FailedPrecondition | Unimplemented | OSError | _handoff.HandoffRefused):
        pool.usable = False
        return True
    return False


def shared_array(
    conn: Connection, shape: tuple[int, ...], dtype: np.dtype[Any], device: int
) -> np.ndarray[Any, Any]:
    """A new array in a dedicated segment: writes from it and reads into it copy nothing here
    (``Client.shared_array``)."""
    pool = pool_of(conn, conn.current_link(None))
    if pool is None:
        raise FailedPrecondition(
            "shared memory needs a daemon on this host (a unix: target) and is off "
            f"with {SHM_ENV}=0 or Client(shared_memory=False)",
            reason="SHARED_MEMORY_UNAVAILABLE",
        )
    timeout = conn.timeout
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    segment = pool.dedicate(max(nbytes, 1), device, timeout)
    array = segment.data[:nbytes].view(dtype).reshape(shape)
    finalizer = weakref.finalize(array, pool.discard, segment.id)
    finalizer.atexit = False  # at exit the daemon frees it all when we detach
    return array
