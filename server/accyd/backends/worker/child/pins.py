"""The worker's mappings of the front's shared memory: the front's memfd, mapped and pinned here.

``PIN`` names a descriptor of the front (its pid and fd number) and the file's
identity. The worker, the front's child and of the same user, opens it through
``/proc/<front pid>/fd/<fd>`` (a new open of the same file: a sealed memfd opens
read-write), checks it is the file the front named, maps it shared and pins the
mapping with its backend's own ``pin_host`` (``cuMemHostRegister`` on CUDA).
``WRITE_SHARED``/``READ_SHARED`` then copy between a slice of that mapping and a
buffer: the same bytes the front sees, none of them on the channel.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
from collections.abc import Iterator

from accyd.backends.base import Backend
from accyd.errors import LaunchArgumentMismatch

__all__ = ["SharedMapping", "SharedMappings", "map_front_file"]


def map_front_file(pid: int, fd: int, size: int, dev: int, ino: int) -> mmap.mmap:
    """The first ``size`` bytes of the file the front (``pid``) holds as ``fd``, mapped shared
    and writable here. ``OSError`` when it cannot be opened or is not that file."""
    own = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
    try:
        found = os.fstat(own)
        if (found.st_dev, found.st_ino) != (dev, ino):
            raise OSError(errno.ESTALE, f"descriptor {fd} of process {pid} is another file")
        if found.st_size < size:
            raise OSError(errno.EINVAL, f"the file has {found.st_size} bytes, not {size}")
        return mmap.mmap(own, size)  # shared, read-write; keeps a descriptor of its own
    finally:
        os.close(own)


class SharedMapping:
    """One pin: the worker's mapping of a front file and what its backend's ``pin_host`` made.

    Owned by ``SharedMappings``. Copies hold it through ``part`` (any thread);
    ``close`` waits for them, unpins on the backend, then unmaps."""

    def __init__(self, mapping: mmap.mmap, view: memoryview, pinned: object) -> None:
        self.map = mapping
        self.view = view
        self.pinned = pinned
        self.size = view.nbytes
        self._users = 0
        self._closed = False
        self._idle = threading.Condition()

    @contextlib.contextmanager
    def part(self, start: int, size: int) -> Iterator[memoryview]:
        """Bytes ``start..start+size`` of the mapping, kept mapped until the block ends."""
        if start < 0 or size < 0 or start + size > self.size:
            raise LaunchArgumentMismatch(
                f"bytes {start}..{start + size} are outside a shared mapping of {self.size} bytes"
            )
        with self._idle:
            if self._closed:
                raise LaunchArgumentMismatch("the shared memory was unpinned")
            self._users += 1
        try:
            yield self.view[start : start + size]
        finally:
            with self._idle:
                self._users -= 1
                if not self._users:
                    self._idle.notify_all()

    def close(self, backend: Backend) -> None:
        """Wait for copies using it, unpin (``backend``'s ``unpin_host``), unmap; once."""
        with self._idle:
            if self._closed:
                return
            self._closed = True
            while self._users:
                self._idle.wait()
        try:
            backend.unpin_host(self.pinned)
        finally:
            self.pinned = None
            # A view a copy still holds keeps the mapping until it goes (never reused meanwhile).
            with contextlib.suppress(BufferError):
                self.view.release()
                self.map.close()


class SharedMappings:
    """The worker's pins by the front's pin id; owns their mappings, not the backend."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._lock = threading.Lock()
        self._pins: dict[int, SharedMapping] = {}

    def pin(self, hid: int, pid: int, fd: int, size: int, dev: int, ino: int) -> str | None:
        """Map the front's file and pin it as ``hid``: None, or why it could not be mapped (the
        front then copies bytes). The backend's own errors (``OutOfMemory``...) are raised."""
        try:
            mapping = map_front_file(pid, fd, size, dev, ino)
        except (OSError, ValueError) as error:
            return f"{type(error).__name__}: {error}"
        view = memoryview(mapping)
        try:
            pinned = self._backend.pin_host(view)
        except BaseException:
            view.release()
            mapping.close()
            raise
        with self._lock:
            self._pins[hid] = SharedMapping(mapping, view, pinned)
        return None

    def get(self, hid: int) -> SharedMapping:
        with self._lock:
            found = self._pins.get(hid)
        if found is None:
            raise LaunchArgumentMismatch(f"shared memory {hid} is not pinned")
        return found

    def unpin(self, hid: int) -> None:
        """Unpin and unmap ``hid`` (after the copies using it); nothing if it is gone."""
        with self._lock:
            found = self._pins.pop(hid, None)
        if found is not None:
            found.close(self._backend)

    def close(self) -> None:
        """Unpin and unmap every pin left (the worker is closing)."""
        with self._lock:
            left, self._pins = list(self._pins.values()), {}
        for found in left:
            with contextlib.suppress(Exception):
                found.close(self._backend)
