"""Exported buffers: a client's own buffer memory, handed to it to map with no copy.

``offer_export`` waits for the work queued on the buffer (as a write would), asks
the backend for a new descriptor of its memory (a CUDA VMM allocation's POSIX
descriptor, or the host backend's memfd) and offers it to the buffer's owner
alone through the handoff socket. The daemon closes its descriptor once it is
sent, refused or expired: the client's mapping is then the client's own, and the
memory lives until both the daemon's buffer and every mapping are gone, so a freed
buffer is never reused under a client still mapping it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from accyd.backends.base import Exported
from accyd.core.buffers import Transfer
from accyd.core.interface import Core
from accyd.core.tenants import Usage
from accyd.doors.hostmem.handoff import Handoff, Offered

__all__ = ["ExportOffer", "offer_export"]

log = structlog.get_logger("accyd.doors.hostmem")


@dataclass(frozen=True, slots=True)
class ExportOffer:
    export_id: str
    ticket: bytes
    handoff_name: str
    exported: Exported
    byte_size: int
    device: int


_OFFERED = Usage(descriptors=1)
"""What an export's offer holds until it is sent, refused or expired: its descriptor."""


class _Descriptor:
    """The daemon's copy of an exported descriptor: closed once, whatever happens first, and
    its charge given back then."""

    def __init__(self, fd: int, refund: Callable[[], None]) -> None:
        self._fd: int | None = fd
        self._refund = refund
        self._lock = threading.Lock()

    def fds(self) -> list[int]:
        return [] if self._fd is None else [self._fd]

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
            self._refund()


def offer_export(
    daemon: Core,
    handoff: Handoff,
    client_id: str,
    buffer_id: str,
    transfer: Transfer | None = None,
) -> ExportOffer:
    """*Blocking*: offer ``client_id`` its buffer's memory once the work before is over.

    ``transfer``: the buffer's write opened already (and its hazards awaited, so this
    thread waits only for the client's own transfers). One offer per buffer at a time:
    asking again replaces (and closes) the one before.
    """
    if transfer is None:
        transfer = daemon.open_write(client_id, buffer_id)
    with transfer:
        client = daemon.charge(client_id, _OFFERED)
        try:
            exported = transfer.export()
        except BaseException:
            daemon.refund(client, _OFFERED)
            raise
        record = transfer.record
    descriptor = _Descriptor(exported.fd, lambda: daemon.refund(client, _OFFERED))
    export_id = f"{record.id}.export"
    try:
        ticket = handoff.offer(
            Offered(
                export_id,
                client_id,
                descriptor.fds,
                failed=descriptor.close,
                dropped=descriptor.close,
                sent=descriptor.close,
            )
        )
    except BaseException:
        descriptor.close()
        raise
    log.info(
        "buffer exported",
        client_id=client_id,
        buffer_id=record.id,
        kind=exported.kind.value,
        bytes=exported.mapping_size,
    )
    return ExportOffer(
        export_id, ticket, handoff.path.name, exported, record.byte_size, record.device
    )
