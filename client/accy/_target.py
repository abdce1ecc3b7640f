"""Where a client dials: the target given, else ``ACCY_TARGET``, else the default socket."""

from __future__ import annotations

from pathlib import Path

from accy.protocol import check_socket_folder, default_target
from accy.protocol import default_socket_path as _default_socket_path

__all__ = ["resolve_target", "unix_socket_of"]


def resolve_target(target: str | None = None) -> str:
    """The address to dial: ``target``, else ``ACCY_TARGET``, else the daemon's default socket.

    A bare filesystem path is taken as a Unix socket. The default socket's folder
    must be this user's alone (``UnsafeSocketFolder`` otherwise): under ``/tmp``
    another user could have made it and be listening there.
    """
    if not target:
        target = default_target()
        default = _default_socket_path()
        if target == f"unix:{default}":
            check_socket_folder(default.parent)
    if target.startswith(("/", "./")):
        target = f"unix:{target}"
    return target


def unix_socket_of(target: str) -> Path | None:
    """The socket path of a ``unix:`` target (a daemon on this host), else ``None``."""
    return Path(target.removeprefix("unix:")) if target.startswith("unix:") else None
