"""One host-shared segment: a sealed memfd the daemon maps, page-locks once and shares."""

from __future__ import annotations

import contextlib
import os
import threading

from accyd.backends.base import Backend
from accyd.core.clients import Client
from accyd.memfd import sealed_memfd

__all__ = ["HostSegment"]


class HostSegment:
    """The daemon's side of one client's segment: the memfd, its mapping and its pinning.

    Sealed against shrinking and growing before the client sees it, so nothing
    the client does to its copy can make a daemon copy fault. ``lock`` is held
    by each copy and by ``close``, so a segment never goes while a copy uses it.
    Pinned with its memfd (``pin_host(view, fd=...)``): a device worker maps the
    same file and copies from its own mapping; the fd stays open until unpinned.
    """

    def __init__(
        self, segment_id: str, client: Client, byte_size: int, device: int, backend: Backend
    ) -> None:
        self.id = segment_id
        self.client = client
        self.byte_size = byte_size
        self.device = device
        self.lock = threading.Lock()
        self.closed = False
        self._backend = backend
        self.fd, self._map = sealed_memfd("accy-segment", byte_size)
        self.view = memoryview(self._map)
        try:
            self._pinned = backend.pin_host(self.view, fd=self.fd)
        except BaseException:
            self.view.release()
            self._map.close()
            os.close(self.fd)
            raise

    def fds(self) -> list[int]:
        return [self.fd]

    def repin(self, backend: Backend) -> None:
        """Pin for ``backend``, which replaced the faulted one of this segment's device (the
        old pinning went with its worker); waits for a copy in flight. Without it copies
        through the new worker would carry their bytes."""
        with self.lock:
            if self.closed or backend is self._backend:
                return
            old, self._backend = (self._backend, self._pinned), backend
            self._pinned = backend.pin_host(self.view, fd=self.fd)
        old[0].unpin_host(old[1])  # a no-op on the faulted one

    def range(self, offset: int, size: int) -> memoryview:
        """Bytes ``offset..offset+size`` of the segment (the caller checked the range)."""
        return self.view[offset : offset + size]

    def close(self) -> None:
        """Unpin, unmap and close; waits for a copy in flight; idempotent."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            try:
                self._backend.unpin_host(self._pinned)
            finally:
                self._pinned = None
                # A view some copy still holds keeps the mapping until it goes; never the fd.
                with contextlib.suppress(BufferError):
                    self.view.release()
                    self._map.close()
                with contextlib.suppress(OSError):
                    os.close(self.fd)
