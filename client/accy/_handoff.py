"""Taking what the daemon offered (a ring, a memory segment, an export) from its handoff socket."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from accy.errors import Unavailable

__all__ = ["HandoffRefused", "take"]


class HandoffRefused(Unavailable):
    """The daemon's handoff socket gave nothing: it refused the ticket (expired, used, or not
    this object's) or did not answer in time."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="HANDOFF_REFUSED")


def take(
    handoff: Path, object_id: str, ticket: bytes, count: int, timeout: float = 5.0
) -> list[int]:
    """The ``count`` descriptors offered as ``object_id`` for ``ticket`` (the caller owns them)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as conn:
        conn.settimeout(timeout)
        try:
            conn.connect(str(handoff))
            conn.sendall(object_id.encode("ascii").ljust(64, b"\0") + ticket)
            data, fds, _flags, _addr = socket.recv_fds(conn, 1, count)
        except TimeoutError:
            raise HandoffRefused(
                f"the daemon's handoff socket did not hand over {object_id} within {timeout:g} s"
            ) from None
    if data != b"\x01" or len(fds) != count:
        for fd in fds:
            os.close(fd)
        raise HandoffRefused(f"the daemon refused the ticket for {object_id}")
    return fds
