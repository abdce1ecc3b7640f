"""A link's copying threads for large transfers: one that has the daemon copy the pieces, in
order, and a few that copy a piece's parts on this side beside the caller's thread."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

__all__ = ["COPY_THREADS", "CopyThreads"]

COPY_THREADS = 4
"""Threads (the caller's among them) that copy a piece between the caller's array and a
segment, in parts: one thread copied about 5 GB/s on the H200's host, less than the daemon's
side of the same piece (its staging copies with four)."""
_PART_BYTES = 4 << 20
"""The least one of those threads is given: smaller parts cost more in hand-offs."""


class CopyThreads:
    """Made at a link's first large transfer, each pool on first use; ``close()`` lets them go."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._daemon: ThreadPoolExecutor | None = None
        """One thread that has the daemon copy the pieces (one at a time, in order) while the
        caller's thread copies on this side."""
        self._parts: ThreadPoolExecutor | None = None
        """``COPY_THREADS - 1`` threads that copy parts of a piece beside the caller's."""

    def daemon_copies(self, work: Callable[[], int]) -> Future[int]:
        """``work`` (one daemon copy) after those submitted before; where the client was
        closed meanwhile (the pool shut down), done on this thread instead, where the copier
        raises ``ClientClosed``."""
        with self._lock:
            if self._daemon is None:
                self._daemon = ThreadPoolExecutor(1, thread_name_prefix="accy-shm-daemon")
            pool = self._daemon
        try:
            return pool.submit(work)
        except RuntimeError:
            done: Future[int] = Future()
            try:
                done.set_result(work())
            except BaseException as error:  # handed to the waiter, who raises it
                done.set_exception(error)
            return done

    def copy(self, into: np.ndarray[Any, Any], source: np.ndarray[Any, Any]) -> None:
        """``into[:] = source`` (bytes of one size), in parts on up to ``COPY_THREADS``
        threads (numpy lets go of the GIL while it copies)."""
        size = source.nbytes
        parts = min(COPY_THREADS, size // _PART_BYTES, len(os.sched_getaffinity(0)))
        if parts <= 1:
            into[:] = source
            return
        step = (-(-size // parts) + 4095) // 4096 * 4096  # whole pages, rounded up
        with self._lock:
            if self._parts is None:
                self._parts = ThreadPoolExecutor(COPY_THREADS - 1, thread_name_prefix="accy-shm")
            threads = self._parts

        def part(at: int) -> None:
            into[at : at + step] = source[at : at + step]

        try:
            others = [threads.submit(part, at) for at in range(step, size, step)]
        except RuntimeError:  # closed by another thread meanwhile: its copier says so next
            into[:] = source
            return
        try:
            part(0)
        finally:
            futures.wait(others)  # none may still write ``into`` once this returns
        for other in others:
            other.result()

    def close(self) -> None:
        with self._lock:
            pools = (self._daemon, self._parts)
            self._daemon = self._parts = None
        for pool in pools:
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
