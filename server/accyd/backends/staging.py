"""Large copies of host memory that is not page-locked, staged through a fixed pinned pool.

A DMA engine copies only from page-locked memory; page-locking a fresh segment
for its first copy (``cuMemHostRegister``) costs about 0.8 s per GiB on the
H200, which made a first 1 GiB upload run at 0.96 GB/s against 47-53 GB/s
from memory already locked. So a backend keeps a few staging slots, locked
once when it starts, and moves a large copy through them in chunks: several
threads copy chunk *i+1* between the caller's memory and a free slot while
the device's copy engine moves chunk *i* between another slot and the buffer.
The cost is one host memcpy, spread over threads and overlapped with the DMA.

This module is the engine, backend-neutral: a ``Dma`` says how a slot's bytes
reach a buffer (CUDA: ``cuMemcpyHtoDAsync`` and an event per slot; the host
backend: its stream worker), so the host backend runs the same path in CI.
Slots are shared by every caller: each copy takes ``depth`` of them for its
duration (waiting for them if others hold them all), so a copy is never
starved of slots midway and concurrent copies each keep their overlap.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, Protocol, TypeVar

import numpy as np

from accyd.backends.base import DeviceBuffer, Stream

__all__ = [
    "CHUNK_BYTES",
    "COPY_THREADS",
    "DEPTH",
    "SLOTS",
    "STAGE_FROM_BYTES",
    "Dma",
    "Staging",
    "address_of",
    "parallel_copy",
]

CHUNK_BYTES = 8 << 20
"""One slot's size: the bytes one DMA moves."""
SLOTS = 8
"""Slots per backend (``SLOTS * CHUNK_BYTES`` page-locked once: 64 MiB)."""
DEPTH = 2
"""Slots one copy holds: one filled by the threads while the other is in the DMA."""
COPY_THREADS = 4
"""Threads that copy one chunk between the caller's memory and a slot, in parts."""
STAGE_FROM_BYTES = 4 << 20
"""Copies of this size or more are staged; smaller ones go as they are (the driver stages a
pageable copy itself, at a cost that does not matter for them)."""
_PART_BYTES = 1 << 20
"""The least a copy thread is given: smaller parts cost more in hand-offs than they save."""

_Token = TypeVar("_Token")


class Dma(Protocol[_Token]):
    """How a backend moves a slot's bytes to and from a buffer, asynchronously, in order on
    ``stream``; ``wait`` blocks until the copy a token names is done (raising its error)."""

    def to_device(
        self, slot: int, buffer: DeviceBuffer, offset: int, size: int, stream: Stream | None
    ) -> _Token: ...

    def to_host(
        self, slot: int, buffer: DeviceBuffer, offset: int, size: int, stream: Stream | None
    ) -> _Token: ...

    def wait(self, token: _Token) -> None: ...


def address_of(view: memoryview) -> int:
    """The address of the first byte of a C-contiguous view (read-only views too)."""
    return int(np.frombuffer(view, np.uint8).ctypes.data)


def parallel_copy(
    target: int, source: int, size: int, threads: ThreadPoolExecutor | None, parts: int
) -> None:
    """``memmove`` of ``size`` bytes, split over up to ``parts`` threads (this one does a part
    too). ``ctypes.memmove`` lets the GIL go, so the parts run at once."""
    count = max(1, min(parts, size // _PART_BYTES))
    if count == 1 or threads is None:
        ctypes.memmove(target, source, size)
        return
    step = -(-size // count)
    started: list[Future[object]] = [
        threads.submit(ctypes.memmove, target + at, source + at, min(step, size - at))
        for at in range(step, size, step)
    ]
    ctypes.memmove(target, source, min(step, size))
    for future in started:
        future.result()


class Staging(Generic[_Token]):
    """The slots (their host memory, ``views``) and the copies through them.

    ``views`` are made by the backend (page-locked memory it frees itself after
    ``close``). Thread-safe: any number of callers copy at once.
    """

    def __init__(
        self,
        views: Sequence[memoryview],
        dma: Dma[_Token],
        *,
        depth: int = DEPTH,
        copy_threads: int = COPY_THREADS,
    ) -> None:
        if not views or depth < 1:
            raise ValueError("staging needs at least one slot")
        self.depth = min(depth, len(views))
        self.chunk = min(view.nbytes for view in views)
        self._addresses = [address_of(view) for view in views]
        self._dma = dma
        self._free = list(range(len(views)))
        self._slots_free = threading.Condition()
        self._parts = copy_threads
        self._threads = (
            ThreadPoolExecutor(copy_threads - 1, "accyd-stage") if copy_threads > 1 else None
        )
        self.staged = 0
        """Copies staged so far (for tests and benchmarks)."""

    def _take(self) -> list[int]:
        with self._slots_free:
            while len(self._free) < self.depth:
                self._slots_free.wait()
            taken, self._free = self._free[: self.depth], self._free[self.depth :]
            return taken

    def _give(self, slots: list[int]) -> None:
        with self._slots_free:
            self._free.extend(slots)
            self._slots_free.notify_all()

    def _copy(self, target: int, source: int, size: int) -> None:
        parallel_copy(target, source, size, self._threads, self._parts)

    def write(
        self, buffer: DeviceBuffer, offset: int, data: memoryview, stream: Stream | None
    ) -> None:
        """Copy ``data`` into ``buffer`` at ``offset``, in order on ``stream``; done on return."""
        source, size, chunk = address_of(data), data.nbytes, self.chunk
        slots = self._take()
        pending: list[_Token | None] = [None] * len(slots)
        try:
            for index, at in enumerate(range(0, size, chunk)):
                lane = index % len(slots)
                if pending[lane] is not None:
                    self._wait(pending, lane)  # its slot is free again
                length = min(chunk, size - at)
                self._copy(self._addresses[slots[lane]], source + at, length)
                pending[lane] = self._dma.to_device(
                    slots[lane], buffer, offset + at, length, stream
                )
        finally:
            self._finish(pending, slots)
        self.staged += 1

    def read_into(
        self, buffer: DeviceBuffer, offset: int, out: memoryview, stream: Stream | None
    ) -> None:
        """Copy ``out.nbytes`` bytes of ``buffer`` from ``offset`` into ``out``, in order on
        ``stream``; done on return."""
        target, size, chunk = address_of(out), out.nbytes, self.chunk
        starts = list(range(0, size, chunk))
        slots = self._take()
        pending: list[_Token | None] = [None] * len(slots)

        def fetch(index: int) -> None:
            lane, at = index % len(slots), starts[index]
            pending[lane] = self._dma.to_host(
                slots[lane], buffer, offset + at, min(chunk, size - at), stream
            )

        try:
            for index in range(min(len(slots), len(starts))):
                fetch(index)
            for index, at in enumerate(starts):
                lane = index % len(slots)
                self._wait(pending, lane)
                self._copy(target + at, self._addresses[slots[lane]], min(chunk, size - at))
                if index + len(slots) < len(starts):
                    fetch(index + len(slots))
        finally:
            self._finish(pending, slots)
        self.staged += 1

    def _wait(self, pending: list[_Token | None], lane: int) -> None:
        token, pending[lane] = pending[lane], None
        if token is not None:
            self._dma.wait(token)

    def _finish(self, pending: list[_Token | None], slots: list[int]) -> None:
        """Wait for every DMA still using the copy's slots (errors after the first are the
        first's), then give the slots back."""
        try:
            error: BaseException | None = None
            for lane in range(len(pending)):
                try:
                    self._wait(pending, lane)
                except BaseException as failed:
                    error = error or failed
            if error is not None:
                raise error
        finally:
            self._give(slots)

    def close(self) -> None:
        """Stop the copy threads (the caller frees the slots' memory after)."""
        if self._threads is not None:
            self._threads.shutdown(wait=True)


class LazyStaging(Generic[_Token]):
    """A ``Staging`` made on first use (or in the background from the start), once."""

    def __init__(self, make: Callable[[], Staging[_Token]], *, background: bool) -> None:
        self._make = make
        self._made: Staging[_Token] | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        if background:
            threading.Thread(target=self.get, name="accyd-staging-start", daemon=True).start()

    def get(self) -> Staging[_Token] | None:
        """The staging, made now if it was not (``None`` if it could not be: copies then go
        as they are)."""
        with self._lock:
            if self._made is None and self._error is None:
                try:
                    self._made = self._make()
                except Exception as error:  # no page-locked memory left: stage nothing
                    self._error = error
            return self._made

    def peek(self) -> Staging[_Token] | None:
        return self._made

    def close(self) -> None:
        """Wait for a staging being made (in the background) and make none after: its owner
        is about to free the device's context, which a make still running would find gone."""
        with self._lock:
            if self._made is None and self._error is None:
                self._error = RuntimeError("closed before its staging was made")
