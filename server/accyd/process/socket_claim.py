"""A Unix socket path that one daemon alone serves: a lock beside it, and only its own file removed.

``SocketClaim.take`` locks ``<socket>.lock`` (``fcntl.flock``) before the
daemon binds, so a second daemon on the same path is refused at start even if
the socket file was removed under the first; the kernel drops the lock when
its holder dies, so a crashed daemon never blocks its successor. ``release``
removes the socket file only if it is still the one this daemon bound (same
device and inode) and then unlocks: a daemon that stops listening and drains
hands the path over at once, and never deletes the socket of the successor
that took it meanwhile. The lock file stays (removing it would race with a
daemon opening it).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

from accy.protocol import UnsafeSocketFolder, is_default_socket, prepare_socket_folder
from accyd.errors import Unavailable

__all__ = ["SocketClaim", "umask"]

SOCKET_MODE = 0o660
FOLDER_MODE = 0o700


class SocketClaim:
    """This daemon's hold on one Unix socket path: ``take``, bind, ``bound``, ``release``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock_path = path.with_name(path.name + ".lock")
        self._lock: int | None = None
        self._identity: tuple[int, int] | None = None

    def take(self) -> None:
        """Lock the path for this daemon and clear a stale socket file; refuse a taken one.

        The default socket's folder must be this user's alone (under /tmp anyone could
        make it first and listen in its place).
        """
        if is_default_socket(self.path):
            try:
                prepare_socket_folder(self.path.parent)
            except UnsafeSocketFolder as error:
                raise Unavailable(str(error)) from error
        if not self.path.parent.exists():
            self.path.parent.mkdir(mode=FOLDER_MODE, parents=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise Unavailable(
                f"another daemon serves {self.path} (it holds {self.lock_path}); stop it "
                "first, or choose another --listen path"
            ) from None
        self._lock = fd
        try:
            _clear_stale(self.path)
        except BaseException:
            self.release()
            raise

    def bound(self) -> None:
        """Note the socket file this daemon made, and open it to its group."""
        status = os.stat(self.path)
        self._identity = (status.st_dev, status.st_ino)
        os.chmod(self.path, SOCKET_MODE)

    def release(self) -> None:
        """Remove this daemon's socket file (not another's), then unlock; idempotent."""
        identity, self._identity = self._identity, None
        if identity is not None:
            with contextlib.suppress(FileNotFoundError):
                status = os.lstat(self.path)
                if (status.st_dev, status.st_ino) == identity:
                    self.path.unlink()
        lock, self._lock = self._lock, None
        if lock is not None:
            os.close(lock)  # closing drops the flock


def _clear_stale(path: Path) -> None:
    """Remove a socket file nobody listens on; refuse a live one or a file that is no socket."""
    if not path.exists() and not path.is_symlink():
        return
    if not stat.S_ISSOCK(path.lstat().st_mode):
        raise Unavailable(f"{path} exists and is no socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()  # nobody listens: a stale socket of a dead daemon
    else:
        raise Unavailable(f"another daemon already listens on {path}")
    finally:
        probe.close()


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """Files made meanwhile (a socket bound) get at most ``~mask``; the old mask comes back."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)
