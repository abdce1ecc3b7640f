"""Where the daemon listens by default: a Unix socket in a per-user runtime directory.

Shared by the daemon (``accyd``) and the client (``accy``); imports nothing of either.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["SOCKET_NAME", "TARGET_ENV", "default_socket_path", "default_target"]

SOCKET_NAME = "accyd.sock"
TARGET_ENV = "ACCY_TARGET"


def default_socket_path() -> Path:
    """``$XDG_RUNTIME_DIR/accy/accyd.sock``, else ``/tmp/accy-$UID/accyd.sock``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "accy" / SOCKET_NAME
    return Path("/tmp") / f"accy-{os.getuid()}" / SOCKET_NAME


def default_target() -> str:
    """The address a client dials without ``--target``: ``ACCY_TARGET``, else the default socket."""
    return os.environ.get(TARGET_ENV) or f"unix:{default_socket_path()}"
