"""Where the daemon listens by default, and which folders a socket may safely live in.

The default is ``$XDG_RUNTIME_DIR/accy/accyd.sock``, else ``/tmp/accy-$UID/accyd.sock``.
Under ``/tmp`` anyone could make that folder first and put their own socket in it
(and receive the bearer tokens clients send), so the daemon and the client both
refuse a default folder that is not theirs alone.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = [
    "SOCKET_NAME",
    "TARGET_ENV",
    "UnsafeSocketFolder",
    "check_socket_folder",
    "default_socket_path",
    "default_target",
    "is_default_socket",
    "prepare_socket_folder",
    "unsafe_folder_reason",
]

SOCKET_NAME = "accyd.sock"
TARGET_ENV = "ACCY_TARGET"
"""The environment variable that names the daemon's address for clients."""


class UnsafeSocketFolder(PermissionError):
    """A socket folder that someone other than this user owns or may write to."""

    def __init__(self, folder: Path, why: str) -> None:
        self.folder = folder
        self.why = why
        super().__init__(
            f"refusing the socket folder {folder}: {why}; another user could put their own "
            f"socket there. Remove it (the daemon makes it again, mode 0700) or choose a "
            f"socket in a folder only you can write to"
        )


def default_socket_path() -> Path:
    """``$XDG_RUNTIME_DIR/accy/accyd.sock``, else ``/tmp/accy-$UID/accyd.sock``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "accy" / SOCKET_NAME
    return Path("/tmp") / f"accy-{os.getuid()}" / SOCKET_NAME


def default_target() -> str:
    """The address a client dials when given none: ``ACCY_TARGET``, else the default socket."""
    return os.environ.get(TARGET_ENV) or f"unix:{default_socket_path()}"


def is_default_socket(path: Path) -> bool:
    """Whether ``path`` is the default socket (the one whose folder is checked)."""
    return Path(os.path.abspath(path)) == Path(os.path.abspath(default_socket_path()))


def unsafe_folder_reason(folder: Path) -> str:
    """Why ``folder`` is not safe to trust ('' if it is): a symbolic link, not a folder,
    another user's, or one others may write to. A folder that does not exist is safe (it
    is made, mode 0700, when it is needed)."""
    try:
        info = folder.lstat()
    except FileNotFoundError:
        return ""
    except OSError as error:
        return f"it cannot be read ({error.strerror})"
    if stat.S_ISLNK(info.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISDIR(info.st_mode):
        return "it is not a folder"
    uid = os.getuid()
    if info.st_uid != uid:
        return f"it belongs to uid {info.st_uid}, not to you ({uid})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"others may write to it (mode {stat.S_IMODE(info.st_mode):04o})"
    return ""


def check_socket_folder(folder: Path) -> None:
    """Raise ``UnsafeSocketFolder`` unless ``folder`` is a real folder of this user that
    nobody else may write to. A folder that does not exist passes (nothing listens there)."""
    reason = unsafe_folder_reason(folder)
    if reason:
        raise UnsafeSocketFolder(folder, reason)


def prepare_socket_folder(folder: Path) -> None:
    """Make ``folder`` (mode 0700) if it is missing, then check it as ``check_socket_folder``."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_socket_folder(folder)
