"""Owned system shared memory: regions a client registered, opened once, copied with pread/pwrite.

Unlike Triton's, a region here belongs to the one KServe client that registered
it (``owners.py``): another client's status, unregister and inference never see
it. Registering opens the object once, relative to the shared-memory folder,
with ``O_NOFOLLOW`` and ``O_NONBLOCK`` and only after ``lstat`` found a regular
file (the descriptor is checked to be that same file); its owner must be the
caller's user where the daemon can tell it, else the daemon's own. The
descriptor is kept, and data moves by ``pread``/``pwrite``: the daemon never
maps a client's object, so one the client shrinks fails a copy cleanly instead
of killing the daemon with SIGBUS. A copy holds the region, so an unregister
during inferences closes the descriptor only after the last copy is over.

Errors name only what the caller gave (its region name and key), never the
daemon's paths or descriptors. The daemon creates no named object itself.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from accyd.clipping import clip
from accyd.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    QuotaExceeded,
)

__all__ = [
    "MAX_REGIONS",
    "SHM_FOLDER",
    "Region",
    "RegionStatus",
    "Regions",
    "check_key",
    "unknown_region",
]

SHM_FOLDER = "/dev/shm"
"""Where POSIX shared-memory objects live on Linux (shm_open's namespace)."""
MAX_REGIONS = 64
"""The most regions one client holds at once (each is a descriptor in the daemon)."""
MAX_NAME = 256
NAME_MAX = 255
"""The longest object name the file system takes."""


def check_key(key: str) -> str:
    """The object name a key stands for (``/name`` or ``name``: one path component)."""
    name = key[1:] if key.startswith("/") else key
    if not name or len(name) > NAME_MAX or "/" in name or "\0" in name or name in (".", ".."):
        raise InvalidRequest(
            f"key {clip(key)!r} is no shared-memory object name: '/name', where name is 1 to "
            f"{NAME_MAX} characters with no '/' or NUL and is not '.' or '..'",
            field="key",
        )
    return name


@dataclass(frozen=True, slots=True)
class RegionStatus:
    name: str
    key: str
    offset: int
    byte_size: int


class Region:
    """One registered region: its object's descriptor, and the range of it in use."""

    def __init__(
        self, name: str, key: str, fd: int, offset: int, byte_size: int, writable: bool
    ) -> None:
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        self.writable = writable
        self._fd = fd
        self._users = 0
        self._closing = False
        self._lock = threading.Lock()

    @property
    def status(self) -> RegionStatus:
        return RegionStatus(self.name, self.key, self.offset, self.byte_size)

    def acquire(self) -> bool:
        with self._lock:
            if self._closing:
                return False
            self._users += 1
            return True

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._closing and self._users == 0
        if last:
            os.close(self._fd)

    def close(self) -> None:
        """Close the descriptor now, or after the copies in flight (idempotent)."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            now = self._users == 0
        if now:
            os.close(self._fd)

    def _check(self, offset: int, size: int, what: str) -> int:
        if offset < 0 or size < 0 or offset + size > self.byte_size:
            raise InvalidRequest(
                f"{what} bytes {offset}..{offset + size} are outside region {self.name!r} of "
                f"{self.byte_size} bytes",
                field="parameters.shared_memory_offset",
            )
        return self.offset + offset

    def read(self, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` in the region (blocking: off the event loop)."""
        at = self._check(offset, size, "input")
        data = bytearray(size)
        view = memoryview(data)
        done = 0
        while done < size:
            got = os.preadv(self._fd, [view[done:]], at + done)
            if got == 0:
                raise FailedPrecondition(
                    f"region {self.name!r} (key {clip(self.key)!r}) ends before byte "
                    f"{self.offset + offset + size}: its object was truncated after it was "
                    "registered",
                    field="parameters.shared_memory_region",
                )
            done += got
        return bytes(data)

    def write(self, offset: int, data: bytes) -> None:
        """Write ``data`` at ``offset`` in the region (blocking: off the event loop)."""
        at = self._check(offset, len(data), "output")
        if not self.writable:
            raise PermissionDenied(
                f"region {self.name!r} (key {clip(self.key)!r}) was opened read-only: the "
                "daemon may not write its object",
                field="outputs",
            )
        end = at + len(data)
        if os.fstat(self._fd).st_size < end:  # a write past the end would grow it
            raise FailedPrecondition(
                f"region {self.name!r} (key {clip(self.key)!r}) ends before byte {end}: its "
                "object was truncated after it was registered",
                field="parameters.shared_memory_region",
            )
        view = memoryview(data)
        done = 0
        while done < len(data):
            done += os.pwrite(self._fd, view[done:], at + done)


class Regions:
    """One client's regions by name."""

    def __init__(self, limit: int = MAX_REGIONS) -> None:
        self.limit = limit
        self._regions: dict[str, Region] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._regions)

    def register(self, name: str, key: str, offset: int, byte_size: int, owner_uid: int) -> None:
        """*Blocking* (opens a file): open ``key``'s object and keep ``byte_size`` bytes of it
        from ``offset``; its owner must be ``owner_uid``."""
        if not name or len(name) > MAX_NAME:
            raise InvalidRequest(f"a region name is 1 to {MAX_NAME} characters", field="name")
        object_name = check_key(key)
        if byte_size <= 0:
            raise InvalidRequest("byte_size must be positive", field="byte_size")
        with self._lock:
            self._check_free(name)
        fd, writable = _open(object_name, key, owner_uid)
        try:
            size = os.fstat(fd).st_size
            if offset + byte_size > size:
                raise InvalidRequest(
                    f"bytes {offset}..{offset + byte_size} are past the end of the object of "
                    f"key {clip(key)!r} ({size} bytes)",
                    field="byte_size" if offset < size else "offset",
                )
            region = Region(name, key, fd, offset, byte_size, writable)
            with self._lock:
                self._check_free(name)
                self._regions[name] = region
        except BaseException:
            os.close(fd)
            raise

    def _check_free(self, name: str) -> None:
        if name in self._regions:
            raise AlreadyExists(
                f"a region named {clip(name)!r} is registered already: unregister it first",
                field="name",
            )
        if len(self._regions) >= self.limit:
            raise QuotaExceeded(
                f"a client holds at most {self.limit} shared-memory regions: unregister one first",
                quota="shared_memory_regions",
            )

    def unregister(self, name: str) -> None:
        """Drop region ``name`` (``""``: every one); unknown names are no error."""
        with self._lock:
            gone = list(self._regions.values()) if not name else [self._regions.get(name)]
            for region in gone:
                if region is not None:
                    del self._regions[region.name]
        for region in gone:
            if region is not None:
                region.close()

    def has(self, name: str) -> bool:
        return name in self._regions

    def size_of(self, name: str) -> int:
        """Region ``name``'s size; ``NotFound`` where the caller has no such region."""
        with self.use(name) as region:
            return region.byte_size

    def status(self, name: str) -> list[RegionStatus]:
        with self._lock:
            if not name:
                return [r.status for r in self._regions.values()]
            region = self._regions.get(name)
        if region is None:
            raise unknown_region(name)
        return [region.status]

    @contextlib.contextmanager
    def use(self, name: str) -> Iterator[Region]:
        """Region ``name``, held open while the block runs."""
        with self._lock:
            region = self._regions.get(name)
        if region is None or not region.acquire():
            raise NotFound(
                f"no shared-memory region {clip(name)!r} of yours: register it first",
                field="parameters.shared_memory_region",
            )
        try:
            yield region
        finally:
            region.release()

    def close(self) -> None:
        self.unregister("")


def unknown_region(name: str) -> NotFound:
    """What a name with no region of the caller's is answered: another client's alike."""
    return NotFound(f"no shared-memory region {clip(name)!r} of yours", field="name")


def _open(object_name: str, key: str, owner_uid: int) -> tuple[int, bool]:
    """Open a shared-memory object safely: a regular file, no symlink, never blocking."""
    folder = os.open(SHM_FOLDER, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            before = os.stat(object_name, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            raise NotFound(
                f"no shared-memory object with key {clip(key)!r}: create it first", field="key"
            ) from None
        _check_object(before, key, owner_uid)
        flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
        writable = True
        try:
            fd = os.open(object_name, os.O_RDWR | flags, dir_fd=folder)
        except PermissionError:
            writable = False
            fd = _open_read_only(object_name, key, flags, folder)
        except OSError as error:
            raise _open_error(error, key) from None
    finally:
        os.close(folder)
    try:
        after = os.fstat(fd)
        if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
            raise FailedPrecondition(
                f"the object of key {clip(key)!r} was replaced while it was opened: register again",
                field="key",
            )
        _check_object(after, key, owner_uid)
    except BaseException:
        os.close(fd)
        raise
    return fd, writable


def _open_read_only(object_name: str, key: str, flags: int, folder: int) -> int:
    try:
        return os.open(object_name, os.O_RDONLY | flags, dir_fd=folder)
    except OSError as error:
        raise _open_error(error, key) from None


def _check_object(found: os.stat_result, key: str, owner_uid: int) -> None:
    if stat.S_ISLNK(found.st_mode):
        raise InvalidRequest(
            f"key {clip(key)!r} names a symbolic link; register the object itself", field="key"
        )
    if not stat.S_ISREG(found.st_mode):
        raise InvalidRequest(
            f"key {clip(key)!r} names no shared-memory object (a FIFO, folder or device)",
            field="key",
        )
    if found.st_uid != owner_uid:
        raise PermissionDenied(
            f"the object of key {clip(key)!r} belongs to another user: a client registers "
            "only objects of its own user",
            field="key",
        )


def _open_error(error: OSError, key: str) -> Exception:
    if error.errno == errno.ELOOP:
        return InvalidRequest(f"key {clip(key)!r} names a symbolic link", field="key")
    if error.errno == errno.ENOENT:
        return NotFound(f"no shared-memory object with key {clip(key)!r}", field="key")
    if error.errno in (errno.EACCES, errno.EPERM):
        return PermissionDenied(f"the daemon may not open the object of key {clip(key)!r}")
    code = errno.errorcode.get(error.errno or 0, "error")
    return FailedPrecondition(
        f"the object of key {clip(key)!r} cannot be opened ({code})", field="key"
    )
