"""One client's ring on the daemon's side: what each record an engine hands to Python means.

A ring's records are taken by an engine (``accyd.ring.engine``): the native one launches
those matching a ticket by itself and hands every other to Python; the Python loop
hands all of them. ``ServerRing.handle`` decides one record: it is copied out of
shared memory before it is looked at, checked field by field (a hostile or torn
record is refused like a bad request, never a crash or a read outside the ring),
and handed to the same core operation the gRPC door calls, so ownership, counts,
scalar bounds, extents, hazards and quotas are checked once, in one place. A
refusal is written to the ring's error entries, naming the record; the engine
advances ``done`` past it in order.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import structlog

from accy.protocol import ring as layout
from accyd.backends.base import Stream
from accyd.catalog.dtypes import Scalar
from accyd.catalog.model import ScalarSpec
from accyd.core.interface import Core
from accyd.core.launching import LaunchTicket
from accyd.core.tickets import FastLaunch
from accyd.errors import (
    AccyError,
    DeviceFault,
    FailedPrecondition,
    InvalidRequest,
    LaunchArgumentMismatch,
    NotFound,
    QuotaExceeded,
)
from accyd.ring.copies import Copier
from accyd.ring.memory import RingMemory
from accyd.ring.observer import RingObserver
from accyd.ring.records import id_of, scalar_struct
from accyd.scheduling import DeviceWork, launch_or_defer

__all__ = ["BOUND_HANDLES", "NOTHING", "Handled", "Pending", "ServerRing"]

log = structlog.get_logger("accyd.ring")

BOUND_HANDLES = 65536
"""Sessions and buffers bound on one ring at once, at most: a client that never unbinds
cannot grow the daemon's tables without end (the client library unbinds what it frees)."""


@dataclass(frozen=True, slots=True)
class Handled:
    """What a record came to: where its work went (a session's stream), a ticket for the
    same launch again, and whether the ring's tickets must go (a handle was unbound)."""

    session_id: str | None = None
    device: int = 0
    stream: Stream | None = None
    fast: FastLaunch | None = None
    reap: bool = False
    """It ran on scratch of its own: reap its session once it is over (the scratch goes)."""
    clear: bool = False


NOTHING = Handled()


class Pending:
    """A record still being handled off the engine (a copy, a launch allocating scratch);
    the ring takes nothing after it until it is over."""

    __slots__ = ("_future",)

    def __init__(self, future: Future[Handled]) -> None:
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def result(self) -> Handled:
        """What it came to (call once ``done()``); its refusal was written already."""
        return self._future.result()

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        self._future.add_done_callback(lambda _: callback())


@dataclass(frozen=True, slots=True)
class _SessionBinding:
    session_id: str
    specs: tuple[ScalarSpec, ...]
    unpack: struct.Struct


class ServerRing:
    """The daemon's view of one client's ring: its bindings and its error entries.

    Owns its ``RingMemory`` (closed by ``close``, once the engine let the ring go).
    ``handle`` runs on one thread at a time (the engine's slow path); error entries may
    also be written from a copy's or a launch's completion, so they take a lock.
    """

    def __init__(
        self,
        ring_id: str,
        client_id: str,
        memory: RingMemory,
        core: Core,
        work: DeviceWork,
        copier: Copier | None = None,
        observer: RingObserver | None = None,
    ) -> None:
        """``work``: where a launch that needs scratch of its own finishes (the device-work
        threads, within the client's share), never on the thread deciding records."""
        self.id = ring_id
        self.client_id = client_id
        self.memory = memory
        self._core = core
        self._sessions: dict[int, _SessionBinding] = {}
        self._buffers: dict[int, str] = {}
        self._errors = 0
        self._entries = threading.Lock()
        self._copier = copier
        self._observer = observer
        self._work = work
        self.broken = False
        self.abandoned = False
        """Its client is gone (``abandon``): no record of it is decided any more."""
        self.engine_index = 0
        """The engine's number for this ring while it takes it."""
        self.device_waits = False
        """Its client follows a device-served ring's wait (``OpenRingRequest.device_waits``)."""
        self.device_served = False
        """The device launcher serves it (set by the engine when it takes the ring)."""

    # Records ---------------------------------------------------------------------

    def handle(self, seq: int, raw: bytes) -> Handled | Pending:
        """Decide record ``seq`` (its whole slot, copied out): enqueue, bind, copy or refuse;
        nothing once the ring is abandoned."""
        if self.abandoned:
            return NOTHING
        (got, kind, flags, handle, n_ops, n_res, n_scalars, *rest) = layout.RECORD.unpack_from(raw)
        handles, values = rest[: layout.MAX_BUFFERS], rest[layout.MAX_BUFFERS]
        try:
            if got != seq:
                raise InvalidRequest(f"slot holds record {got}, expected {seq}", field="seq")
            if kind == layout.Kind.LAUNCH:
                if n_ops + n_res > layout.MAX_BUFFERS:
                    raise InvalidRequest(
                        f"{n_ops} operands and {n_res} results exceed {layout.MAX_BUFFERS}",
                        field="buffers",
                    )
                ops, res = handles[:n_ops], handles[n_ops : n_ops + n_res]
                return self._launch(seq, handle, ops, res, n_scalars, values)
            if kind in (layout.Kind.BIND_SESSION, layout.Kind.BIND_BUFFER):
                self._bind(kind, handle, id_of(raw))
                return NOTHING
            if kind == layout.Kind.COPY:
                return self._copy(seq, flags, handle, values, id_of(raw))
            if kind == layout.Kind.UNBIND:
                self._sessions.pop(handle, None)
                self._buffers.pop(handle, None)
                return Handled(clear=True)  # tickets' keys name handles: one may be bound anew
            raise InvalidRequest(f"unknown record kind {kind}", field="kind")
        except AccyError as error:
            if kind == layout.Kind.LAUNCH:
                binding = self._sessions.get(handle)
                self.refuse_launch(seq, error, binding.session_id if binding else None)
            else:
                self.refuse(seq, error, self._named(kind, handle))
        return NOTHING

    def _launch(
        self,
        seq: int,
        handle: int,
        operands: Sequence[int],
        results: Sequence[int],
        n_scalars: int,
        values: bytes,
    ) -> Handled | Pending:
        binding = self._sessions.get(handle)
        if binding is None:
            raise NotFound(f"no session bound to handle {handle}", field="session")
        if n_scalars != len(binding.specs):
            names = ", ".join(f"{s.name} ({s.dtype.value})" for s in binding.specs) or "none"
            raise LaunchArgumentMismatch(
                f"session {binding.session_id} takes {len(binding.specs)} runtime scalars "
                f"({names}); the record carries {min(n_scalars, layout.MAX_SCALARS)}",
                field="runtime_scalars",
            )
        scalars = {
            spec.name: Scalar(spec.dtype, value)
            for spec, value in zip(binding.specs, binding.unpack.unpack(values), strict=True)
        }
        operand_ids = [self._buffer(h, "operands", i) for i, h in enumerate(operands)]
        result_ids = [self._buffer(h, "results", i) for i, h in enumerate(results)]
        session_id = binding.session_id
        ticket = launch_or_defer(
            self._work,
            self.client_id,
            self._core.launch,
            self.client_id,
            session_id,
            operand_ids,
            result_ids,
            scalars,
            ticket_for=self,
        )
        if isinstance(ticket, Future):  # on scratch of its own: the ring waits for it
            return self._later(seq, session_id, ticket)
        return Handled(session_id, ticket.device, ticket.stream, ticket.fast)

    def _later(self, seq: int, session_id: str, launched: Future[LaunchTicket]) -> Pending:
        """A launch finished off the engine: its refusal written once it is known."""
        handled: Future[Handled] = Future()

        def done(future: Future[LaunchTicket]) -> None:
            try:
                ticket = future.result()
            except AccyError as error:
                self.refuse_launch(seq, error, session_id)
                handled.set_result(NOTHING)
            except BaseException as error:  # a bug: the record is refused, the ring goes on
                log.exception("a ring launch failed", ring_id=self.id, client_id=self.client_id)
                self.refuse_launch(
                    seq, FailedPrecondition(f"the launch failed: {error}"), session_id
                )
                handled.set_result(NOTHING)
            else:
                handled.set_result(Handled(session_id, ticket.device, ticket.stream, reap=True))

        launched.add_done_callback(done)
        return Pending(handled)

    def _copy(self, seq: int, flags: int, handle: int, values: bytes, segment_id: str) -> Pending:
        """Start a COPY record on a copy thread; the ring takes nothing more until it is over."""
        buffer_id = self._buffer(handle, "buffer", 0)
        if self._copier is None:
            raise FailedPrecondition(
                "this daemon runs no ring copies: copy with CopySegment", field="kind"
            )
        copying = self._copier.start(self.client_id, flags, values, buffer_id, segment_id)
        handled: Future[Handled] = Future()

        def done() -> None:
            try:
                copying.outcome()
            except AccyError as error:
                self.refuse(seq, error, copying.what)
            handled.set_result(NOTHING)

        copying.add_done_callback(done)
        return Pending(handled)

    def _bind(self, kind: int, handle: int, object_id: str) -> None:
        if handle in self._sessions or handle in self._buffers:
            raise InvalidRequest(f"handle {handle} is bound already", field="handle")
        if len(self._sessions) + len(self._buffers) >= BOUND_HANDLES:
            raise QuotaExceeded(
                f"a ring holds at most {BOUND_HANDLES} bound sessions and buffers; unbind "
                "those no longer used (free them, or release their sessions)",
                quota="ring_bound_handles",
                field="handle",
            )
        if kind == layout.Kind.BIND_SESSION:
            specs = self._core.session_scalars(self.client_id, object_id)
            if len(specs) > layout.MAX_SCALARS:
                raise LaunchArgumentMismatch(
                    f"session {object_id} takes {len(specs)} runtime scalars; "
                    f"the ring carries at most {layout.MAX_SCALARS}",
                    field="session_id",
                )
            self._sessions[handle] = _SessionBinding(object_id, specs, scalar_struct(specs))
        else:
            self._core.check_buffer(self.client_id, object_id)
            self._buffers[handle] = object_id

    def _buffer(self, handle: int, role: str, index: int) -> str:
        buffer_id = self._buffers.get(handle)
        if buffer_id is None:
            raise NotFound(f"no buffer bound to handle {handle}", field=f"{role}[{index}]")
        return buffer_id

    def _named(self, kind: int, handle: int) -> str:
        """What a refused record other than a launch was, for its message."""
        if kind == layout.Kind.COPY:
            return f"copy with buffer {self._buffers.get(handle, handle)}"
        return "binding" if kind != layout.Kind.UNBIND else "unbinding"

    # Errors ---------------------------------------------------------------------------

    def refuse_launch(self, seq: int, error: AccyError, session_id: str | None) -> None:
        """Refuse a launch record (counted as a refused launch)."""
        what = f"launch of session {session_id}" if session_id else "launch"
        self.refuse(seq, error, what)
        if self._observer is not None:
            self._observer.refused(self.client_id, session_id, error)

    def fault(self, seq: int, error: AccyError, session_id: str | None, device: int) -> None:
        """A launch the engine made failed on the device: the core notes it (a device fault
        latched, as every door's wait latches it) and the entry names the session whose
        launch it was, whoever latched the device first (its worker's death, say)."""
        what = f"launch of session {session_id}" if session_id else "launch"
        if not isinstance(error, DeviceFault):
            self.refuse(seq, error, what)
            return
        named = DeviceFault(error.message, session=session_id or error.session)
        noted = self._core.note_fault(named, session_id, device)
        scoped = DeviceFault(
            noted.message,
            session=named.session or noted.session,
            device=noted.device,
            isolated=noted.isolated,
        )
        self.refuse(seq, scoped, what)

    def refuse(self, seq: int, error: AccyError, what: str = "record") -> None:
        """Write an error entry for record ``seq``, then publish the count."""
        if isinstance(error, DeviceFault) and not error.isolated:
            self.broken = True  # the daemon is going away; one device's fault spares the ring
        session = b""
        if isinstance(error, DeviceFault):
            session = layout.fault_origin(error.session, error.device if error.isolated else None)
        with self._entries:
            self.memory.write_entry(
                self._errors,
                seq,
                error.reason,
                error.field or "",
                session,
                f"{what}: {error.message}",
            )
            self._errors += 1
            self.memory.set_u64(layout.ERRORS, self._errors)
        if not self.memory.shared:  # a stream's reader sends the entry on
            self.memory.wake_client()
        log.info(
            "ring record refused",
            client_id=self.client_id,
            ring_id=self.id,
            seq=seq,
            reason=error.reason,
            error=error.message,
        )

    def break_off(self, tail: int, why: str) -> None:
        """A client that broke the ring's rules: refuse everything from now on."""
        self.refuse(tail, InvalidRequest(f"ring closed: {why}", field="head"))
        self.broken = True
        self.memory.mark_closed()

    def settled(self) -> bool:
        """Whether every record published so far has finished or been refused (``done``
        reached ``head``), or none can be any more: the ring broken, abandoned, closed, or
        its head beyond one ring of ``done`` (a client that broke the rules; the engine
        breaks it)."""
        if self.broken or self.abandoned:
            return True
        try:
            head, done = self.memory.u64(layout.HEAD), self.memory.u64(layout.DONE)
        except ValueError:  # closed
            return True
        return done >= head or head - done > self.memory.slot_count

    def abandon(self) -> None:
        """Its client is gone: the engine decides none of its records from now on (it stops
        taking the ring until it lets it go), so a departed client's queued records cost
        nothing (16 clients' 4,096 refused records each once took seconds of the daemon's
        CPU after they left, one by one)."""
        self.abandoned = True

    def close(self) -> None:
        """Unmap (once the engine let the ring go); the client's own mapping stays valid."""
        self.memory.close()
