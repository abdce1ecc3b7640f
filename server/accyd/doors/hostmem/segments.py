"""Each client's host-shared segments: made, charged, handed over, copied with, freed.

A segment is made by the daemon for one attached client (``open``), counts
against its tenant's memory quota, and goes to that client alone through the
handoff socket. Copies between a segment and one of the client's buffers run
as the buffer's transfers do (``Daemon.open_write`` / ``open_read``): on the
client's transfer stream, after the buffer's hazards, then recorded for later
work. Ids are looked up per client, so no client can name another's segment.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from accyd.backends.base import Backend
from accyd.core.buffers import Transfer
from accyd.core.holdings import MAX_BUFFER_BYTES
from accyd.core.ids import new_id
from accyd.core.interface import Core
from accyd.core.tenants import Usage
from accyd.doors.hostmem.exports import ExportOffer, offer_export
from accyd.doors.hostmem.handoff import Handoff, Offered
from accyd.doors.hostmem.segment import HostSegment
from accyd.errors import (
    AccyError,
    FailedPrecondition,
    InvalidRequest,
    NotFound,
    QuotaExceeded,
)

__all__ = ["MAX_SEGMENTS_PER_CLIENT", "SegmentCopy", "SegmentOffer", "Segments"]

log = structlog.get_logger("accyd.doors.hostmem")

MAX_SEGMENTS_PER_CLIENT = 64
"""Each segment is a descriptor and a mapping in the daemon: bound them per client."""
SEGMENT_DESCRIPTORS = 2
"""What a segment holds in the daemon: its memfd, and its mapping's own descriptor."""


def segment_usage(byte_size: int) -> Usage:
    """What a segment costs its tenant: memory (as a buffer does), the daemon's host memory
    shared with clients, and its descriptors."""
    return Usage(
        memory_bytes=byte_size, host_memory_bytes=byte_size, descriptors=SEGMENT_DESCRIPTORS
    )


class SegmentCopy:
    """One checked copy between a segment and a buffer, ordered after the buffer's work."""

    __slots__ = (
        "buffer_offset",
        "segment",
        "segment_offset",
        "size",
        "to_buffer",
        "transfer",
    )

    def __init__(
        self,
        segment: HostSegment,
        segment_offset: int,
        transfer: Transfer,
        buffer_offset: int,
        size: int,
        to_buffer: bool,
    ) -> None:
        self.segment = segment
        self.segment_offset = segment_offset
        self.transfer = transfer
        self.buffer_offset = buffer_offset
        self.size = size
        self.to_buffer = to_buffer

    @property
    def tenant(self) -> str:
        return self.segment.client.tenant.name

    def when_ready(self, ready: Callable[[], None]) -> None:
        """Call ``ready`` (from any thread) once the buffer's earlier work this copy is
        ordered after is over; no thread waits meanwhile."""
        self.transfer.when_ready(ready)

    def run(self) -> int:
        """*Blocking*: move the bytes (the buffer's hazards over first, if not awaited
        already); the bytes copied. Holds the segment's lock, so a close waits for it."""
        segment, transfer = self.segment, self.transfer
        with transfer, segment.lock:
            if segment.closed:
                raise NotFound(f"segment {segment.id} was closed", field="segment_id")
            with segment.range(self.segment_offset, self.size) as part:
                if self.to_buffer:
                    transfer.write(self.buffer_offset, part)
                else:
                    transfer.read_into(self.buffer_offset, part)
        return self.size

    def abandon(self) -> None:
        """Give up before ``run`` (its hazards are let go; nothing moved)."""
        self.transfer.finish()


@dataclass(frozen=True, slots=True)
class SegmentOffer:
    segment_id: str
    ticket: bytes
    handoff_name: str
    byte_size: int


class Segments:
    """The segments of every client, over the daemon facade and a handoff socket."""

    def __init__(self, daemon: Core, handoff: Handoff | None) -> None:
        self._daemon = daemon
        self._handoff = handoff
        self._by_client: dict[str, dict[str, HostSegment]] = {}
        self._lock = threading.Lock()

    def _sharing(self, field: str) -> Handoff:
        handoff = self._handoff
        if handoff is None or not handoff.open:
            raise FailedPrecondition(
                "this daemon serves no Unix socket, so it shares no memory: "
                "write and read buffers over gRPC",
                field=field,
            )
        return handoff

    def open_export(self, client_id: str, buffer_id: str) -> Transfer:
        """The write an export of the client's own buffer is ordered as (quick); its hazards
        are for the caller to await before ``export``."""
        self._sharing("buffer_id")
        return self._daemon.open_write(client_id, buffer_id)

    def export(
        self, client_id: str, buffer_id: str, transfer: Transfer | None = None
    ) -> ExportOffer:
        """*Blocking*: the client's own buffer, offered for it to map (``offer_export``)."""
        return offer_export(
            self._daemon, self._sharing("buffer_id"), client_id, buffer_id, transfer
        )

    def open(self, client_id: str, byte_size: int, device: int = 0) -> SegmentOffer:
        """*Blocking* (pinning takes a while): a new segment for ``client_id``, offered."""
        handoff = self._sharing("byte_size")
        if not 0 < byte_size <= MAX_BUFFER_BYTES:
            raise InvalidRequest(
                f"byte_size must be 1..{MAX_BUFFER_BYTES}, not {byte_size}", field="byte_size"
            )
        backend = self._daemon.backends.get(device)
        if backend is None:
            raise NotFound(
                f"no device {device}; this daemon serves {sorted(self._daemon.backends)}",
                field="device",
            )
        with self._lock:
            if len(self._by_client.get(client_id, {})) >= MAX_SEGMENTS_PER_CLIENT:
                raise QuotaExceeded(
                    f"a client may hold {MAX_SEGMENTS_PER_CLIENT} shared segments: "
                    "close one (or reuse it) first",
                    quota="segments",
                )
        usage = segment_usage(byte_size)
        client = self._daemon.charge(client_id, usage)
        try:
            segment = HostSegment(new_id("seg"), client, byte_size, device, backend)
        except OSError as error:
            self._daemon.refund(client, usage)
            raise QuotaExceeded(
                f"no shared segment of {byte_size} bytes: {error.strerror}", quota="memory"
            ) from error
        except BaseException:
            self._daemon.refund(client, usage)
            raise
        with self._lock:
            self._by_client.setdefault(client_id, {})[segment.id] = segment
        try:
            self._daemon.client(client_id)  # detached meanwhile: it never sees this one
        except NotFound:
            self.close(client_id, segment.id)
            raise
        segment_id = segment.id
        ticket = handoff.offer(
            Offered(segment_id, client_id, segment.fds, dropped=lambda: self._untaken(segment_id))
        )
        log.info("segment opened", client_id=client_id, segment_id=segment.id, bytes=byte_size)
        return SegmentOffer(segment.id, ticket, handoff.path.name, byte_size)

    def _untaken(self, segment_id: str) -> None:
        """Its offer expired, or its client went, before the client took it: nobody can map
        it, so it is freed (on a thread: a copy may hold it, and the handoff waits for none)."""
        with self._lock:
            for held in self._by_client.values():
                segment = held.pop(segment_id, None)
                if segment is not None:
                    break
            else:
                return
        log.info("segment never taken; freed", client_id=segment.client.id, segment_id=segment_id)
        threading.Thread(target=self._free, args=(segment,), name="accyd-segment-free").start()

    def _segment(self, client_id: str, segment_id: str) -> HostSegment:
        with self._lock:
            segment = self._by_client.get(client_id, {}).get(segment_id)
        if segment is None:
            raise NotFound(f"no segment {segment_id!r} of this client", field="segment_id")
        return segment

    def prepare(
        self,
        client_id: str,
        segment_id: str,
        segment_offset: int,
        buffer_id: str,
        buffer_offset: int,
        size: int,
        *,
        to_buffer: bool,
    ) -> SegmentCopy:
        """Check a copy of ``size`` bytes between a segment and a buffer and order it after the
        buffer's work (quick: nothing moves). The caller waits for ``transfer``'s hazards
        without a thread (``Transfer.settled``), then runs it (``SegmentCopy.run``: on its
        own, a run also waits for them, on its thread)."""
        segment = self._segment(client_id, segment_id)
        if segment_offset < 0 or size < 0 or segment_offset + size > segment.byte_size:
            raise InvalidRequest(
                f"bytes {segment_offset}..{segment_offset + size} are outside segment "
                f"{segment_id} of {segment.byte_size} bytes",
                field="segment_offset",
            )
        if to_buffer:
            transfer = self._daemon.open_write(client_id, buffer_id)
        else:
            transfer = self._daemon.open_read(client_id, buffer_id)
        try:
            transfer.check_range(buffer_offset, size, "buffer_offset")
        except BaseException:
            transfer.finish()
            raise
        return SegmentCopy(segment, segment_offset, transfer, buffer_offset, size, to_buffer)

    def close(self, client_id: str, segment_id: str) -> None:
        """Free one segment: waits for a copy using it; the client's mapping stays its own."""
        with self._lock:
            segment = self._by_client.get(client_id, {}).pop(segment_id, None)
        if segment is None:
            raise NotFound(f"no segment {segment_id!r} of this client", field="segment_id")
        self._free(segment)

    def close_client(self, client_id: str) -> None:
        """Free every segment of a client that detached (its offers are withdrawn), here: taken
        out first, so a withdrawn offer's own freeing (``_untaken``) finds nothing to do."""
        with self._lock:
            segments = list(self._by_client.pop(client_id, {}).values())
        if self._handoff is not None:
            self._handoff.withdraw_client(client_id)
        for segment in segments:
            self._free(segment)

    def close_all(self) -> None:
        with self._lock:
            clients = list(self._by_client)
        for client_id in clients:
            self.close_client(client_id)

    def device_replaced(self, device: int, backend: Backend) -> int:
        """The daemon's extension hook: ``repin``."""
        return self.repin(device, backend)

    def repin(self, device: int, backend: Backend) -> int:
        """*Blocking*: pin every open segment of ``device`` for ``backend``, which replaced
        the device's faulted one; how many there were."""
        with self._lock:
            segments = [
                segment
                for held in self._by_client.values()
                for segment in held.values()
                if segment.device == device
            ]
        for segment in segments:
            try:
                segment.repin(backend)
            except AccyError as error:  # its copies then carry their bytes: slower, still right
                log.warning("segment not pinned again", segment_id=segment.id, error=str(error))
        return len(segments)

    def count(self, client_id: str) -> int:
        with self._lock:
            return len(self._by_client.get(client_id, {}))

    def _free(self, segment: HostSegment) -> None:
        segment.close()
        self._daemon.refund(segment.client, segment_usage(segment.byte_size))
        log.info("segment closed", client_id=segment.client.id, segment_id=segment.id)
