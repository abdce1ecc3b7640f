"""Buffer bytes through memory shared with a daemon on the same host, gRPC behind them.

A link's ``SharedBytes`` keeps a ``SharedPool``: segments the daemon made
(``OpenSegment``), taken from its handoff socket like a ring, mapped here and
reused. A write copies the data into a segment (none when the array already
lives in one: ``Client.shared_array``) and has the daemon copy it into the
buffer on its transfer stream (a COPY record on a shared ring, else a
``CopySegment`` call); a read is the reverse. A transfer larger than ``CHUNK_BYTES``
moves in pieces through two pooled segments in turn, the daemon copying one while this
side copies the other. Below ``SHM_THRESHOLD`` bytes,
where the daemon shares no memory, and when its segments ran out, a transfer
takes the streamed calls instead. ``ACCY_SHM=0`` (or
``Client(shared_memory=False)``) keeps every transfer on gRPC.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import time
import weakref
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from accy import _handoff
from accy._chunks import Progress
from accy._connection import Connection
from accy._copying import CopyThreads
from accy._link import Link
from accy._seam import CopyRequest, ReadRequest, WriteRequest
from accy._target import unix_socket_of
from accy._unary import StreamedBytes
from accy.errors import AccyError, FailedPrecondition, ResourceExhausted, Unimplemented
from accy.protocol.launch.v1 import launch_pb2 as pb

__all__ = ["SHM_ENV", "SHM_THRESHOLD", "Segment", "SharedBytes", "SharedPool", "shm_wanted"]

SHM_ENV = "ACCY_SHM"
SHM_THRESHOLD = 256 << 10
"""Transfers of at least this many bytes go through shared memory. Measured on the host
backend (2 busy cores, best of 7, write/read): 64 KiB 1.45/1.27 ms against gRPC's
2.29/1.47; 256 KiB 1.38/1.51 against 3.94/2.35; 4 MiB 3.15/2.85 against 21.98/10.63.
Below 256 KiB the gain is within the noise of the two extra calls."""
MIN_SEGMENT = 4 << 20
POOLED_SEGMENTS = 4
"""Idle segments a link keeps for reuse (the daemon pins each once: reuse is the point)."""
CHUNK_BYTES = 64 << 20
"""A transfer of more bytes than this (not from a shared array) moves in pieces of this size
through two pooled segments in turn: this side copies a piece into one (or out of it) while
the daemon copies the other, so a fresh client maps and faults 128 MiB, not the whole
transfer, and the two sides' copies overlap. (A 1 GiB ``client.buffer(array)`` through one
fresh 1 GiB segment ran at 1.2 GB/s on the H200, its page faults and two serial copies.)"""


_NOT_SHARED = (FailedPrecondition, Unimplemented, OSError, _handoff.HandoffRefused)
"""What says a daemon shares no memory with this client: it serves no Unix socket, it
predates shared memory, or its handoff failed."""


class Copier(Protocol):
    """Has the daemon copy between a segment and a buffer (a COPY record, or a call)."""

    def copy(self, request: CopyRequest) -> int: ...


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

    def _close_remote(self, segment_id: str) -> None:
        conn, link = self._conn, self._link
        if conn.closed or link.lost is not None:
            return
        request = pb.CloseSegmentRequest(segment_id=segment_id)
        conn.later(lambda: conn.call(conn.stub.CloseSegment, request, link=link))


class SharedBytes:
    """One link's buffer bytes: large ones and shared arrays through its ``SharedPool``, the
    rest (and everything once the daemon showed it shares no memory) by ``fallback``."""

    def __init__(self, pool: SharedPool, copier: Copier, fallback: StreamedBytes) -> None:
        self.pool = pool
        self._copier = copier
        self._fallback = fallback
        self._threads = CopyThreads()

    def write(self, request: WriteRequest) -> int:
        buffer_id, device, data, offset, timeout, _, progress = request
        raw = np.frombuffer(data, dtype=np.uint8)
        if self._wanted(raw):
            moved = self._moved(
                raw, buffer_id, device, offset, timeout, to_buffer=True, progress=progress
            )
            if moved is not None:
                return moved
        return self._fallback.write(request)

    def read(self, request: ReadRequest) -> np.ndarray[Any, Any]:
        buffer_id, device, offset, size, into, timeout, _, progress = request
        target = np.empty(size, np.uint8) if into is None else into.reshape(-1).view(np.uint8)
        if self._wanted(target):
            moved = self._moved(
                target, buffer_id, device, offset, timeout, to_buffer=False, progress=progress
            )
            if moved is not None:
                return target
        return self._fallback.read(request)

    def _wanted(self, data: np.ndarray[Any, Any]) -> bool:
        """Whether ``data`` goes through shared memory: large, or in a shared array."""
        pool = self.pool
        return pool.usable and (data.nbytes >= SHM_THRESHOLD or pool.locate(data) is not None)

    def _moved(
        self,
        raw: np.ndarray[Any, Any],
        buffer_id: str,
        device: int,
        offset: int,
        timeout: float | None,
        *,
        to_buffer: bool,
        progress: Progress | None = None,
    ) -> int | None:
        """Move ``raw`` (bytes, to or from the buffer at ``offset``) through shared memory;
        the bytes moved, or ``None`` where this transfer takes gRPC instead."""
        pool, copier, size = self.pool, self._copier, raw.nbytes
        placed = pool.locate(raw)
        if placed is not None:  # the array lives in shared memory: nothing to copy here
            segment, at = placed
            return copier.copy(
                CopyRequest(segment.id, at, buffer_id, offset, size, to_buffer, timeout)
            )
        try:
            if size > CHUNK_BYTES:
                return self._in_pieces(raw, buffer_id, device, offset, timeout, to_buffer, progress)
            with pool.lease(size, device, timeout) as segment:
                if to_buffer:
                    self._threads.copy(segment.data[:size], raw)
                moved = copier.copy(
                    CopyRequest(segment.id, 0, buffer_id, offset, size, to_buffer, timeout)
                )
                if not to_buffer:
                    self._threads.copy(raw, segment.data[:size])
                return moved
        except ResourceExhausted:  # no segment to be had (the daemon's per-client limit, or
            return None  # the tenant's memory): this transfer needs none
        except (AccyError, OSError) as error:
            if isinstance(error, _NOT_SHARED):
                pool.usable = False  # this daemon shares no memory with this client
                return None
            raise

    def _in_pieces(
        self,
        raw: np.ndarray[Any, Any],
        buffer_id: str,
        device: int,
        offset: int,
        timeout: float | None,
        to_buffer: bool,
        progress: Progress | None,
    ) -> int:
        """Move ``raw`` in ``CHUNK_BYTES`` pieces through two leased segments (one where the
        second cannot be had): the helper thread has the daemon copy a piece while this
        thread copies the next one in (a write) or the last one out (a read)."""
        size = raw.nbytes
        deadline = None if timeout is None else time.monotonic() + timeout
        pieces = [(at, min(CHUNK_BYTES, size - at)) for at in range(0, size, CHUNK_BYTES)]
        copier, threads = self._copier, self._threads

        def left() -> float | None:
            return None if deadline is None else max(deadline - time.monotonic(), 0.0)

        def daemon_copies(segment: Segment, piece: tuple[int, int]) -> Future[int]:
            at, length = piece
            return threads.daemon_copies(
                lambda: copier.copy(
                    CopyRequest(segment.id, 0, buffer_id, offset + at, length, to_buffer, left())
                ),
            )

        with contextlib.ExitStack() as leases:
            segments = [leases.enter_context(self.pool.lease(CHUNK_BYTES, device, timeout))]
            with contextlib.suppress(ResourceExhausted):
                segments.append(leases.enter_context(self.pool.lease(CHUNK_BYTES, device, left())))
            ways = len(segments)
            copies: list[Future[int]] = []
            try:
                for index, piece in enumerate(pieces):
                    segment = segments[index % ways]
                    at, length = piece
                    if to_buffer:
                        if index >= ways:  # the daemon is done with this segment's last piece
                            _reported(copies[index - ways], progress, pieces[index - ways], size)
                        self._threads.copy(segment.data[:length], raw[at : at + length])
                        copies.append(daemon_copies(segment, piece))
                        continue
                    while len(copies) < min(index + ways, len(pieces)):  # keep both busy
                        ahead = len(copies)
                        copies.append(daemon_copies(segments[ahead % ways], pieces[ahead]))
                    _reported(copies[index], progress, piece, size)
                    self._threads.copy(raw[at : at + length], segment.data[:length])
                if to_buffer:
                    for index in range(max(len(pieces) - ways, 0), len(pieces)):
                        _reported(copies[index], progress, pieces[index], size)
            finally:  # no segment goes back to the pool while the daemon may still copy it
                for copy in copies:
                    copy.cancel()
                for copy in copies:
                    with contextlib.suppress(BaseException):
                        copy.exception()
        return size

    def shared_array(
        self, shape: tuple[int, ...], dtype: np.dtype[Any], device: int, timeout: float | None
    ) -> np.ndarray[Any, Any]:
        """A new array in a dedicated segment: writes from it and reads into it copy nothing
        here (``Client.shared_array``)."""
        pool = self.pool
        if not pool.usable:
            raise no_shared_memory()
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        segment = pool.dedicate(max(nbytes, 1), device, timeout)
        array = segment.data[:nbytes].view(dtype).reshape(shape)
        finalizer = weakref.finalize(array, pool.discard, segment.id)
        finalizer.atexit = False  # at exit the daemon frees it all when we detach
        return array

    def close(self) -> None:
        """Let the copying thread go (the daemon frees the segments when the client detaches)."""
        self._threads.close()


def _reported(
    copy: Future[int], progress: Progress | None, piece: tuple[int, int], total: int
) -> None:
    """Wait for the daemon's copy of ``piece`` (raising what it failed with); report it."""
    copy.result()
    if progress is not None:
        at, length = piece
        progress(at + length, total)


def shm_wanted(conn: Connection) -> Path | None:
    """The daemon's socket path when large transfers should use shared memory, else ``None``."""
    if not conn.shared_memory or os.environ.get(SHM_ENV, "1") == "0":
        return None
    return unix_socket_of(conn.target)


def no_shared_memory() -> FailedPrecondition:
    """Why ``Client.shared_array`` cannot make an array for this client."""
    return FailedPrecondition(
        "shared memory needs a daemon on this host (a unix: target) and is off "
        f"with {SHM_ENV}=0 or Client(shared_memory=False)",
        reason="SHARED_MEMORY_UNAVAILABLE",
    )
