"""Launches through a same-host ring: what ``Session.launch`` uses on a local daemon.

One ``RingPath`` per link, opened on the first launch: an ``OpenRing`` call,
then the ring's memory taken from the handoff socket beside the daemon's
socket. Sessions and buffers are bound to small handles once; each launch is
then one record in shared memory, with no call. A refused or failed launch is
raised by the session's next launch or wait, naming it, as CUDA reports
asynchronous errors.

A client that cannot map the daemon's memory (a TCP target, or a daemon that
offers no shared ring) gets the same ring carried over a ``RingStream`` call
(``accy._ring_stream``): the same records and errors, sent as messages.
``ACCY_RING=0`` keeps a client on ``LaunchStream``; ``ACCY_RING=stream`` takes
the stream even on a local socket.
"""

from __future__ import annotations

import contextlib
import operator
import os
import struct
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import cast

import grpc

from accy._ring import Ring, RingClosed, RingError, RingFull
from accy._ring_stream import RingStreamLink
from accy._rpc import Stub
from accy._target import unix_socket_of
from accy.errors import AccyError, FieldViolation, error_class
from accy.protocol import DEVICE_SCOPE
from accy.protocol import ring as layout
from accy.protocol.launch.v1 import launch_pb2 as pb

__all__ = ["Plan", "RingPath", "open_ring", "open_stream_ring", "ring_wanted", "stream_ring_wanted"]

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

STREAM = "stream"
"""``ACCY_RING=stream``: launch through a ring over a stream even on a local socket."""

ENTRY_GRACE_SECONDS = 0.5
"""How long a wait whose daemon went away still looks for the daemon's word on its work."""

PLANS_KEPT = 256
"""Launch records (sessions and buffers) a ring keeps ready; past this it starts over."""

_NO_SCALARS = struct.Struct(f"{layout.ID_OFFSET - layout.SCALARS_OFFSET}x")

Plan = tuple[bytes, struct.Struct, Callable[[Mapping[str, float]], tuple[object, ...]], bytes]
"""A launch's record without seq and scalars, its scalars' struct, what picks their values out
of the caller's scalars in order, and the record that says the scalars did not pack."""

_PACK = {"f32": "f4x", "f64": "d", "i32": "i4x", "u32": "I4x", "i64": "q", "u64": "Q", "u8": "B7x"}


def ring_wanted(target: str) -> Path | None:
    """The daemon's socket path when launches should go through a shared ring, else ``None``."""
    if os.environ.get(layout.RING_ENV, "1") in ("0", STREAM):
        return None
    return unix_socket_of(target)


def stream_ring_wanted() -> bool:
    """Whether launches without a shared ring should go through a ring over a stream."""
    return os.environ.get(layout.RING_ENV, "1") != "0"


def open_ring(
    call: Callable[[pb.OpenRingRequest], pb.OpenRingResponse],
    socket_path: Path,
    abandoned: Callable[[], bool],
) -> RingPath | None:
    """A ring for the link ``call`` goes out on; ``None`` where the daemon offers none.

    ``abandoned`` says when that link is lost, so no wait outlives the daemon.
    """
    try:
        offer = call(pb.OpenRingRequest())
        ring = Ring.connect(socket_path.with_name(offer.handoff_name), offer.ring_id, offer.ticket)
    except (AccyError, OSError, RingClosed):
        return None
    ring.abandoned = abandoned
    return RingPath(ring)


def open_stream_ring(
    stub: Stub,
    metadata: Sequence[tuple[str, str]],
    translate: Callable[[grpc.RpcError], AccyError],
    abandoned: Callable[[], bool],
    timeout: float,
    window: int,
) -> RingPath | None:
    """A ring carried over a ``RingStream`` call on the link of ``metadata``, holding at least
    ``window`` launches not done (a power of two, 16 to 4096); ``None`` where the daemon
    refuses one (``--no-rings``, or a daemon that predates it)."""
    slots = 1 << max(4, min(12, (window - 1).bit_length()))
    link = RingStreamLink(stub, metadata, translate, slots)
    if not link.opened(timeout):
        link.close()
        return None
    link.ring.abandoned = abandoned
    return RingPath(link.ring, link)


class RingPath:
    """A link's ring, shared by its sessions; owns the ``Ring`` (and the ``RingStream`` call
    that carries it, if any) and closes them."""

    def __init__(self, ring: Ring, stream: RingStreamLink | None = None) -> None:
        self.ring = ring
        self.stream = stream
        self.copies = stream is None
        """Whether COPY records (shared segments) go through this ring."""
        # A lost link's ring is kept (its error entries) until nothing holds its link.
        weakref.finalize(self, ring.close)
        if stream is not None:
            weakref.finalize(self, stream.close)
        self.lock = threading.Lock()
        self._sessions: dict[str, tuple[int, struct.Struct, tuple[str, ...]]] = {}
        self._buffers: dict[str, int] = {}
        self._failed: dict[int, RingError] = {}
        """Errors the daemon wrote and nobody raised yet, by record."""
        self._plans: dict[tuple[str | None, ...], Plan] = {}
        """Launches made before, by session and buffers: their records' fixed parts."""
        self.changes = 0
        """Counts the handles unbound (and buffers lost): a plan is good while it holds."""

    # Binding ---------------------------------------------------------------------------

    def _session(
        self, session_id: str, names: Sequence[str], dtypes: Sequence[str], timeout: float
    ) -> tuple[int, struct.Struct, tuple[str, ...]]:
        bound = self._sessions.get(session_id)
        if bound is None:
            handle = self.ring.new_handle()
            self.ring.bind(layout.Kind.BIND_SESSION, handle, session_id, timeout)
            code = "<" + "".join(_PACK[d] for d in dtypes)
            code += f"{8 * (layout.MAX_SCALARS - len(dtypes))}x"
            bound = self._sessions[session_id] = (handle, struct.Struct(code), tuple(names))
        return bound

    def _buffer(self, buffer_id: str, timeout: float) -> int:
        handle = self._buffers.get(buffer_id)
        if handle is None:
            handle = self.ring.new_handle()
            self.ring.bind(layout.Kind.BIND_BUFFER, handle, buffer_id, timeout)
            self._buffers[buffer_id] = handle
        return handle

    def forget(self, object_id: str) -> None:
        """A buffer about to be freed or a session about to be released: drop its handle
        here and on the daemon (an UNBIND record), so neither side's tables grow with every
        buffer and session a client ever used."""
        with self.lock:
            handle = self._buffers.pop(object_id, None)
            if handle is None:
                session = self._sessions.pop(object_id, None)
                handle = None if session is None else session[0]
            if handle is None:
                return
            self._plans.clear()  # some may name the handle
            self.changes += 1  # and so may plans kept by sessions
            with contextlib.suppress(RingClosed, RingFull, ValueError):
                self.ring.unbind(handle, 1.0)

    # Launching -------------------------------------------------------------------------

    def plan(
        self,
        session_id: str,
        scalar_specs: Sequence[tuple[str, str]],
        operands: Sequence[str],
        results: Sequence[str],
        timeout: float,
    ) -> tuple[Plan, int]:
        """The record of a launch of ``session_id`` on these buffers, bound (once) and kept
        ready, and the ``changes`` it is good for (see ``launch_planned``). ``Session``
        keeps the last one, for its next launch on the same buffers."""
        key = (session_id, *operands, None, *results)
        with self.lock:
            plan = self._plans.get(key)
            if plan is None:
                plan = self._plan(key, session_id, scalar_specs, operands, results, timeout)
            return plan, self.changes

    def launch_planned(
        self,
        plan: Plan,
        changes: int,
        scalars: Mapping[str, float],
        *,
        wait: bool,
        timeout: float,
    ) -> int | None:
        """Publish a launch of ``plan`` with these scalars; with ``wait``, return once it
        finished. Its record's seq, or ``None`` (nothing published) when a handle was
        unbound since the plan was made: ``plan`` again.

        The failures of earlier records nobody raised yet raise first.
        """
        with self.lock:
            ring = self.ring
            if self._failed or ring.has_errors():
                self._raise_failed()
            if changes != self.changes:
                return None
            fixed, packer, values_of, unpacked = plan
            try:
                seq = ring.launch_fixed(fixed, packer, values_of(scalars), wait, timeout)
            except (KeyError, struct.error):  # the daemon says which scalar is missing or wrong
                seq = ring.launch_fixed(unpacked, _NO_SCALARS, (), wait, timeout)
        if wait:
            self.wait(seq, timeout)
        return seq

    def invalidate(self) -> None:
        """Make the plans handed out so far stale (a buffer they name was lost)."""
        with self.lock:
            self.changes += 1

    def _plan(
        self,
        key: tuple[str | None, ...],
        session_id: str,
        scalar_specs: Sequence[tuple[str, str]],
        operands: Sequence[str],
        results: Sequence[str],
        timeout: float,
    ) -> Plan:
        """Bind what a launch names (once) and keep its record's fixed part under ``key``."""
        if len(scalar_specs) > layout.MAX_SCALARS:
            raise ValueError("too many runtime scalars for a ring record")
        names = tuple(name for name, _ in scalar_specs)
        handle, packer, _ = self._session(
            session_id, names, [dtype for _, dtype in scalar_specs], timeout
        )
        ops = [self._buffer(b, timeout) for b in operands]
        res = [self._buffer(b, timeout) for b in results]
        fixed = Ring.fixed_part(handle, ops, res, len(names))
        # A record whose scalars did not pack says it has more than a record holds.
        unpacked = Ring.fixed_part(handle, ops, res, layout.MAX_SCALARS + 1)
        if len(self._plans) >= PLANS_KEPT:
            self._plans.clear()
        plan = self._plans[key] = (fixed, packer, _values_of(names), unpacked)
        return plan

    def copy(
        self,
        segment_id: str,
        segment_offset: int,
        buffer_id: str,
        buffer_offset: int,
        size: int,
        *,
        to_buffer: bool,
        timeout: float,
    ) -> None:
        """Copy between a shared segment and a buffer as one record, in the ring's order;
        return once it is over, raising what it (or earlier ring work) failed with."""
        with self.lock:
            if self._failed or self.ring.has_errors():
                self._raise_failed()
            handle = self._buffer(buffer_id, timeout)
            fields = (segment_offset, buffer_offset, size)
            seq = self.ring.copy(
                handle, segment_id, fields, to_segment=not to_buffer, timeout=timeout
            )
        self.wait(seq, timeout)

    def wait(self, seq: int | None, timeout: float) -> None:
        """Wait for record ``seq`` (every record so far if ``None``); raise what failed."""
        if seq is None:
            with self.lock:
                target = self.ring.head - 1
        else:
            target = seq
        try:
            if target >= 0:
                self.ring.wait(target, timeout)
        except RingClosed:
            # What the daemon wrote about this work says more than its going away: a fault
            # stops the daemon while its submitter writes the entry, so give that a moment.
            deadline = time.monotonic() + ENTRY_GRACE_SECONDS
            while time.monotonic() < deadline and not self.ring.closed:
                with self.lock:
                    self._raise_failed()
                    if target < self.ring.done:
                        return
                time.sleep(0.01)
            raise
        if self._failed or self.ring.has_errors():
            with self.lock:
                self._raise_failed()

    def settle(self, timeout: float | None) -> None:
        """Before a call over gRPC: every record published is checked and enqueued, so the
        call is ordered after them (a closed ring has nothing left to order after)."""
        with contextlib.suppress(RingClosed, TimeoutError, ValueError):
            self.ring.flush(10.0 if timeout is None else timeout)

    def _raise_failed(self) -> None:
        """Raise the oldest failure the daemon wrote and nobody raised yet, if any."""
        for error in self.ring.errors():
            self._failed[error.seq] = error
        if self._failed:
            raise _error(self._failed.pop(min(self._failed)))

    def close(self, drain: float = 0.0) -> None:
        """Close the ring; a stream's first waits up to ``drain`` seconds for the daemon to
        take the records sent (a shared ring's are in the daemon's memory already)."""
        if self.stream is not None:
            self.stream.close(drain)
        with self.lock, contextlib.suppress(Exception):
            self.ring.close()


def _values_of(names: tuple[str, ...]) -> Callable[[Mapping[str, float]], tuple[object, ...]]:
    """What takes the values of ``names`` from a launch's scalars, in order (``KeyError``
    for a missing one)."""
    if not names:
        return lambda scalars: ()
    if len(names) == 1:
        (name,) = names
        return lambda scalars: (scalars[name],)
    return cast(Callable[[Mapping[str, float]], tuple[object, ...]], operator.itemgetter(*names))


def _error(error: RingError) -> AccyError:
    """The typed error for a refused record, as a gRPC call would have raised it."""
    message = f"ring record {error.seq} was refused: {error.message}"
    cls = error_class(_CODES.get(error.reason, grpc.StatusCode.UNKNOWN))
    violations = [FieldViolation(error.field, error.message)] if error.field else []
    session, device = layout.parse_fault_origin(error.session)
    metadata = {"session": session} if session else {}
    if device is not None:
        metadata.update(device=device, scope=DEVICE_SCOPE)
    return cls(message, reason=error.reason, metadata=metadata, field_violations=violations)
