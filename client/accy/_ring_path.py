"""Launches as ring records: in memory shared with a local daemon, or carried by a RingStream call.

A ``RingLaunches`` is one link's launches through its ring, opened by the link's
first launch (``open_ring``: an ``OpenRing`` call, then the ring's memory from
the handoff socket beside the daemon's socket; ``open_stream_ring``: a
``RingStream`` call, for a client that cannot map the daemon's memory). Sessions
and buffers are bound to small handles once; each launch is then one record,
with no call. A refused or failed launch is raised by the next launch or wait
on the ring, naming its record, as CUDA reports asynchronous errors.

It keeps the client's one cache of "the same launch again" (see
``accy._seam``): one packed record per plan, good for one epoch.
"""

from __future__ import annotations

import contextlib
import struct
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import grpc

from accy._connection import UNSET, Connection
from accy._link import Link, lost_of
from accy._ring import Ring, RingClosed, RingError, RingFull
from accy._ring_stream import RingStreamLink
from accy._scalars import RecordScalars
from accy._seam import (
    RECORDS_KEPT,
    CopyRequest,
    LaunchRequest,
    Ticket,
    WaitRequest,
    ids_of,
    session_id_on,
)
from accy.errors import (
    AccyError,
    DeadlineExceeded,
    FieldViolation,
    InvalidArgument,
    Unavailable,
    error_class,
    from_rpc_error,
)
from accy.protocol import DEVICE_SCOPE
from accy.protocol import ring as layout
from accy.protocol.launch.v1 import launch_pb2 as pb

__all__ = ["RING_WAIT_CAP", "RingLaunches", "open_ring", "open_stream_ring"]

_CODES = {
    "INVALID_REQUEST": grpc.StatusCode.INVALID_ARGUMENT,
    "INVALID_ARTIFACT": grpc.StatusCode.INVALID_ARGUMENT,
    "LAUNCH_ARGUMENT_MISMATCH": grpc.StatusCode.INVALID_ARGUMENT,
    "NOT_FOUND": grpc.StatusCode.NOT_FOUND,
    "FAILED_PRECONDITION": grpc.StatusCode.FAILED_PRECONDITION,
    "QUOTA_EXCEEDED": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "OUT_OF_MEMORY": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "UNSUPPORTED": grpc.StatusCode.UNIMPLEMENTED,
    "DEVICE_LOST": grpc.StatusCode.UNAVAILABLE,
    "UNAVAILABLE": grpc.StatusCode.UNAVAILABLE,
    "SHUTTING_DOWN": grpc.StatusCode.UNAVAILABLE,
    "RUNTIME_UNAVAILABLE": grpc.StatusCode.UNAVAILABLE,
}
"""The status code each domain reason is answered with over gRPC, for ring errors."""

ENTRY_GRACE_SECONDS = 0.5
"""How long a wait whose daemon went away still looks for the daemon's word on its work."""
RING_WAIT_CAP = 3600.0
"""A ring wait with no timeout still looks up this often (the daemon may have gone)."""


def open_ring(
    conn: Connection, link: Link, socket_path: Path, timeout: float | None
) -> Ring | None:
    """The shared ring the daemon offers ``link`` (taken from its handoff socket); ``None``
    where it offers none."""
    try:
        asked = pb.OpenRingRequest(device_waits=True)  # Ring's wait follows SPIN_DEVICE
        offer, _ = conn.call(conn.stub.OpenRing, asked, timeout, link=link)
        ring = Ring.connect(socket_path.with_name(offer.handoff_name), offer.ring_id, offer.ticket)
    except (AccyError, OSError, RingClosed):
        return None
    ring.abandoned = lost_of(link)  # no wait outlives the daemon
    return ring


def open_stream_ring(conn: Connection, link: Link, timeout: float | None) -> RingStreamLink | None:
    """A ring carried over a ``RingStream`` call on ``link``, holding at least the client's
    launch window of launches not done (a power of two, 16 to 4096); ``None`` where the
    daemon refuses one (``--no-rings``, or a daemon that predates it)."""
    window = conn.launch_window
    slots = 1 << max(4, min(12, (window - 1).bit_length()))
    translate = weakref.WeakMethod(conn.translate)

    def translated(error: grpc.RpcError) -> AccyError:
        held = translate()
        return held(error) if held is not None else from_rpc_error(error)

    stream = RingStreamLink(conn.stub, link.metadata, translated, slots)
    if not stream.opened(10.0 if timeout is None else timeout):
        stream.close()
        return None
    stream.ring.abandoned = lost_of(link)
    return stream


class _Record:
    """One plan's packed record: the fixed part of its ring record and its scalars' packer,
    good while the ring's epoch is ``epoch``."""

    __slots__ = ("epoch", "fixed", "scalars", "session_id")

    def __init__(self, epoch: int, fixed: bytes, scalars: RecordScalars, session_id: str) -> None:
        self.epoch = epoch
        self.fixed = fixed
        self.scalars = scalars
        self.session_id = session_id


class RingLaunches:
    """One link's launches through its ring, shared by its sessions; owns the ``Ring`` (and the
    ``RingStream`` call that carries it, if any) and closes them."""

    def __init__(self, conn: Connection, link: Link, ring: Ring, stream: RingStreamLink | None):
        self.path = "ring" if stream is None else "ring-stream"
        self.copies = stream is None
        """Whether shared-memory copies go through this ring as COPY records."""
        self.ring = ring
        self.stream = stream
        self._conn = conn
        self._link = link
        # A lost link's ring is kept (its error entries) until nothing holds its link. The
        # finalizers are a net for a link never closed; close() detaches them, or the
        # registry would keep their callbacks (and what those hold) for good.
        self._finalizers = [weakref.finalize(self, ring.close)]
        if stream is not None:
            self._finalizers.append(weakref.finalize(self, stream.close))
        self.lock = threading.Lock()
        """Held while a record is written (one writer at a time)."""
        self._sessions: dict[str, tuple[int, RecordScalars]] = {}
        self._buffers: dict[str, int] = {}
        self._unbinds: list[int] = []
        """Handles forgotten and not unbound on the ring yet (written by the next writer)."""
        self._failed: dict[int, RingError] = {}
        """Errors the daemon wrote and nobody raised yet, by record."""
        self._records: dict[tuple[object, ...], _Record] = {}
        self.epoch = 0
        """Moves when a bound handle goes: a record is good for the epoch it was made in."""

    # Launching -------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> Ticket:
        owner, operands, results, scalars, wait, timeout = request
        left = self._conn.timeout if timeout is UNSET else timeout  # every launch: inline
        if left is None:
            left = RING_WAIT_CAP
        key = (id(owner), *map(id, operands), None, *map(id, results))
        try:
            while True:
                record = self._records.get(key)
                if record is None or record.epoch != self.epoch:
                    record = self._record(key, request, left)
                values = record.scalars.values(scalars)
                with self.lock:
                    ring = self.ring
                    if self._failed or self._unbinds or ring.has_errors():
                        self._before_writing()
                    if record.epoch != self.epoch:
                        continue  # a handle it names went meanwhile: make it again
                    try:
                        seq = ring.launch_fixed(
                            record.fixed, record.scalars.packer, values, wait, left
                        )
                    except (struct.error, OverflowError, TypeError) as error:
                        raise _unpacked(record, values, error) from None
                    except RingFull as full:
                        what = f"the launch on session {record.session_id}"
                        raise self._full(left, what) from full
                    break
            if wait:
                self._wait_for(seq, left, own=True)
        except (AccyError, RingClosed) as error:
            raise self._judged(error, f"a launch of session {owner.id}")  # noqa: B904
        return Ticket(self, record.session_id, wait, seq)

    def _record(self, key: tuple[object, ...], request: LaunchRequest, timeout: float) -> _Record:
        """Look up, check and bind (once) what a launch names; keep its packed record unless
        it names a buffer by an id string (which holds no handle: its ``id()`` proves
        nothing)."""
        link = self._link
        owner, operands, results = request.session, request.operands, request.results
        session_id = session_id_on(owner, link)
        operand_ids = ids_of(operands, link, "operands")
        result_ids = ids_of(results, link, "results")
        with self.lock:
            epoch = self.epoch
            bound = self._sessions.get(session_id)
            if bound is None:
                scalars = RecordScalars(owner.info)
                handle = self._bind(layout.Kind.BIND_SESSION, session_id, timeout)
                bound = self._sessions[session_id] = (handle, scalars)
            handle, scalars = bound
            ops = [self._buffer(b, timeout) for b in operand_ids]
            res = [self._buffer(b, timeout) for b in result_ids]
        fixed = Ring.fixed_part(handle, ops, res, scalars.count)
        record = _Record(epoch, fixed, scalars, session_id)
        if not any(isinstance(b, str) for b in (*operands, *results)):
            if len(self._records) >= RECORDS_KEPT:
                self._records.clear()
            self._records[key] = record
        return record

    def _buffer(self, buffer_id: str, timeout: float) -> int:
        handle = self._buffers.get(buffer_id)
        if handle is None:
            handle = self._buffers[buffer_id] = self._bind(
                layout.Kind.BIND_BUFFER, buffer_id, timeout
            )
        return handle

    def _bind(self, kind: layout.Kind, object_id: str, timeout: float) -> int:
        """(Under the lock.) A new handle for ``object_id``, bound on the ring."""
        if self._failed or self._unbinds or self.ring.has_errors():
            self._before_writing()
        handle = self.ring.new_handle()
        try:
            self.ring.bind(kind, handle, object_id, timeout)
        except RingFull as full:
            raise self._full(timeout, f"binding {object_id}") from full
        return handle

    def forget(self, object_id: str) -> None:
        """Drop ``object_id``'s handle here and on the daemon (an UNBIND record), so neither
        side's tables grow with every buffer and session a client ever used; the records
        kept go stale. Safe from a finalizer: without the lock at hand (another thread, or
        this one, is writing) the UNBIND waits for the next writer."""
        handle = self._buffers.pop(object_id, None)
        if handle is None:
            bound = self._sessions.pop(object_id, None)
            if bound is None:
                return
            handle = bound[0]
        self.epoch += 1
        self._records.clear()
        self._unbinds.append(handle)
        if self.lock.acquire(blocking=False):
            try:
                self._write_unbinds()
            finally:
                self.lock.release()

    def _write_unbinds(self) -> None:
        """(Under the lock.) Unbind the handles forgotten so far."""
        while self._unbinds:
            handle = self._unbinds.pop()
            with contextlib.suppress(RingClosed, RingFull, ValueError):
                self.ring.unbind(handle, 1.0)

    def _before_writing(self, what: str = "this launch") -> None:
        """(Under the lock.) Raise the oldest failure nobody raised yet, saying that what
        was about to be written was not; write the unbinds."""
        if self._unbinds:
            self._write_unbinds()
        try:
            self._raise_failed()
        except AccyError as error:
            error.message = f"{error.message}; {what} was not sent"
            error.args = (error.message,)
            raise

    def copy(self, request: CopyRequest) -> int:
        """Copy between a shared segment and a buffer as one COPY record, in the ring's order;
        return once it is over, raising what it (or earlier ring work) failed with."""
        left = self._timeout(request.timeout)
        buffer_id = request.buffer_id
        try:
            with self.lock:
                self._before_writing("this copy")
                handle = self._buffer(buffer_id, left)
                fields = (request.segment_offset, request.buffer_offset, request.size)
                seq = self.ring.copy(
                    handle,
                    request.segment_id,
                    fields,
                    to_segment=not request.to_buffer,
                    timeout=left,
                )
            self._wait_for(seq, left)
        except (AccyError, RingClosed) as error:
            raise self._judged(error, f"a copy with buffer {buffer_id}")  # noqa: B904
        return request.size

    # Waiting ---------------------------------------------------------------------------

    def wait(self, request: WaitRequest) -> None:
        ticket, session_id, timeout = request
        if ticket is None and session_id is None:
            self._settle(timeout)
            return
        left = self._timeout(timeout)
        try:
            if ticket is not None:
                assert ticket.record is not None
                self._wait_for(ticket.record, left, own=True)
            else:
                with self.lock:
                    last = self.ring.head - 1
                self._wait_for(last, left)
        except (AccyError, RingClosed) as error:
            what = ticket.name if ticket is not None else f"work enqueued on session {session_id}"
            raise self._judged(error, what)  # noqa: B904

    def _wait_for(self, seq: int, timeout: float, *, own: bool = False) -> None:
        """Wait for record ``seq`` (and those before it); raise what failed (``own``: the
        waiter is record ``seq``'s launch, whose own error reads as such)."""
        mine = seq if own else None
        try:
            if seq >= 0:
                self.ring.wait(seq, timeout)
        except RingClosed:
            # What the daemon wrote about this work says more than its going away: a fault
            # stops the daemon while its submitter writes the entry, so give that a moment.
            deadline = time.monotonic() + ENTRY_GRACE_SECONDS
            while time.monotonic() < deadline and not self.ring.closed:
                with self.lock:
                    self._raise_failed(mine)
                    if seq < self.ring.done:
                        return
                time.sleep(0.01)
            raise
        if self._failed or self.ring.has_errors():
            with self.lock:
                self._raise_failed(mine)

    def _settle(self, timeout: float | None) -> None:
        """Before a call over gRPC: every record published is checked and enqueued, so the
        call is ordered after them (a closed ring has nothing left to order after)."""
        if self._unbinds and self.lock.acquire(blocking=False):
            try:
                self._write_unbinds()
            finally:
                self.lock.release()
        with contextlib.suppress(RingClosed, DeadlineExceeded, ValueError):
            self.ring.flush(10.0 if timeout is None else timeout)

    def _raise_failed(self, mine: int | None = None) -> None:
        """(Under the lock.) Raise the oldest failure the daemon wrote and nobody raised yet
        (``mine``: the record of the launch that raises it)."""
        for error in self.ring.errors():
            self._failed[error.seq] = error
        if self._failed:
            oldest = self._failed.pop(min(self._failed))
            raise _error(oldest, own=oldest.seq == mine)

    # Errors and closing ------------------------------------------------------------------

    def _timeout(self, timeout: Any) -> float:
        left = self._conn.timeout_of(timeout)
        return RING_WAIT_CAP if left is None else float(left)

    def _full(self, timeout: float, what: str) -> DeadlineExceeded:
        ring = "ring stream" if self.stream is not None else "ring"
        return DeadlineExceeded(
            f"the client's {ring} held {self.ring.slots} launches not done for {timeout:g} s; "
            f"{what} was not sent"
        )

    def _judged(self, error: AccyError | RingClosed, what: str) -> AccyError:
        """The error to raise for ring work of ``what`` that failed with ``error``: judged as
        a call's (a daemon-wide device fault loses the link); a closed ring says why (caused
        by ``error``). Raised as ``raise self._judged(error, ...)``, with no local holding it:
        a frame that held its own error would keep itself, and the buffers it names, in a
        cycle until the collector ran."""
        if isinstance(error, AccyError):
            return self._conn.judged(error, self._link)
        if self._link.lost is not None:
            judged: AccyError = self._link.lost_error(what)
        elif self._conn.closed:
            judged = self._conn.closed_error()
        else:
            judged = Unavailable(
                f"{what}: the daemon closed this client's ring ({error}); launch it again",
                reason="RING_CLOSED",
            )
        judged.__cause__ = error
        return judged

    def close(self, drain: float = 0.0) -> None:
        """Close the ring; a stream's first waits up to ``drain`` seconds for the daemon to
        take the records sent (a shared ring's are in the daemon's memory already)."""
        if self.stream is not None:
            self.stream.close(drain)
        with self.lock, contextlib.suppress(Exception):
            self.ring.close()
        for finalizer in self._finalizers:
            finalizer.detach()

    def abandon(self) -> None:
        """In a forked child: let go of the ring without writing to it or taking a lock (a
        thread of the parent may have held one at the fork)."""
        self.ring.close_in_child()
        if self.stream is not None:
            self.stream.close_in_child()


def _unpacked(record: _Record, values: tuple[object, ...], error: Exception) -> InvalidArgument:
    given = dict(zip(record.scalars.names, values, strict=True))
    return InvalidArgument(
        f"runtime scalars {given} do not pack into a ring record: {error}",
        reason="LOCAL_SCALAR_INVALID",
    )


def _error(error: RingError, *, own: bool = False) -> AccyError:
    """The typed error for a refused record, as a gRPC call would have raised it: the
    launch's own error for the launch that waits on it (``own``), the record named first
    for any other."""
    if own:
        message = f"{error.message} (ring record {error.seq})"
    else:
        message = f"ring record {error.seq} was refused: {error.message}"
    cls = error_class(_CODES.get(error.reason, grpc.StatusCode.UNKNOWN))
    violations = [FieldViolation(error.field, error.message)] if error.field else []
    session, device = layout.parse_fault_origin(error.session)
    metadata = {"record": str(error.seq)}
    if session:
        metadata["session"] = session
    if device is not None:
        metadata.update(device=device, scope=DEVICE_SCOPE)
    return cls(message, reason=error.reason, metadata=metadata, field_violations=violations)
