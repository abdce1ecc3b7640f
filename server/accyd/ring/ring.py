"""One client's ring on the daemon's side: read records, check them, launch through the core.

Every record is copied out of shared memory before it is looked at, checked
field by field (a hostile or torn record is refused like a bad request, never
a crash or a read outside the ring), and handed to the same core operation the
gRPC door calls, so ownership, counts, scalar bounds, extents, hazards and
quotas are checked once, in one place. Refusals and failures are written to
the ring's error entries, naming the record; ``done`` advances past a record
once it finished on the device or was refused.
"""

from __future__ import annotations

import contextlib
import struct
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from accy.protocol import ring as layout
from accyd.catalog.dtypes import Scalar
from accyd.catalog.model import ScalarSpec
from accyd.core.launching import BoundLaunch
from accyd.core.marks import MarkWatch
from accyd.errors import (
    AccyError,
    DeviceFault,
    FailedPrecondition,
    InvalidRequest,
    LaunchArgumentMismatch,
    NotFound,
    QuotaExceeded,
)
from accyd.ring.copies import Copier, CopyInFlight
from accyd.ring.memory import RingMemory
from accyd.ring.needs import RingCore, RingObserver
from accyd.ring.records import KEY, KEY_END, KIND, LAUNCH_KIND, Batch, id_of, scalar_struct

__all__ = ["BOUND_HANDLES", "RingCore", "ServerRing"]

log = structlog.get_logger("accyd.ring")

BOUND_PER_RING = 1024
"""Launches a ring keeps checked (by record contents); past this it starts over."""

BOUND_HANDLES = 65536
"""Sessions and buffers bound on one ring at once, at most: a client that never unbinds
cannot grow the daemon's tables without end (the client library unbinds what it frees)."""
TOUCH_SECONDS = 0.05
"""How often a busy ring tells the core its client is alive (liveness is judged in seconds)."""


@dataclass(frozen=True, slots=True)
class _Bound:
    session_id: str
    launch: BoundLaunch


@dataclass(frozen=True, slots=True)
class _SessionBinding:
    session_id: str
    specs: tuple[ScalarSpec, ...]
    unpack: struct.Struct


@dataclass(slots=True)
class _Flight:
    """One batch of records: over once the newest launch of each session it used is."""

    end: int
    """``done`` may pass to this once the batch is over."""
    watches: list[tuple[str, MarkWatch]]
    """Each session's newest launch in the batch."""
    reap: set[str]
    """Sessions whose launches ran on scratch of their own: freed once the batch is over."""
    copy: CopyInFlight | None = None
    """A COPY record, the batch's last: no record after it is taken until it is over."""


class ServerRing:
    """The daemon's view of one client's ring; used only by the submitter thread.

    Owns its ``RingMemory`` and the marks of its launches in flight (each a
    ``MarkWatch`` it closes once the launch is over, or in ``close()``).
    """

    def __init__(
        self,
        ring_id: str,
        client_id: str,
        memory: RingMemory,
        core: RingCore,
        copier: Copier | None = None,
        observer: RingObserver | None = None,
    ) -> None:
        self.id = ring_id
        self.client_id = client_id
        self.memory = memory
        self._core = core
        self._tail = 0
        self._done = 0
        self._errors = 0
        self._sessions: dict[int, _SessionBinding] = {}
        self._buffers: dict[int, str] = {}
        self._flights: deque[_Flight] = deque()
        self._bound: dict[bytes, _Bound] = {}
        """Launches checked once, by their records' contents: replayed without a check."""
        self._frees = 0
        self._touched = 0.0
        self._copier = copier
        self._copying: CopyInFlight | None = None
        self._observer = observer
        self.broken = False

    @property
    def in_flight(self) -> bool:
        return bool(self._flights)

    def pending(self) -> bool:
        """Records published and not taken yet (none while a copy runs: they wait for it)."""
        if self.broken or (self._copying is not None and not self._copying.done()):
            return False
        return self.memory.u64(layout.HEAD) != self._tail

    # Taking records -------------------------------------------------------------

    def take(self, limit: int) -> int:
        """Check and enqueue up to ``limit`` published records; how many were taken."""
        if self.broken:
            return 0
        if self._copying is not None:
            if not self._copying.done():
                return 0
            self._copying = None
        memory = self.memory
        head = memory.u64(layout.HEAD)
        tail = self._tail
        ahead = head - tail
        if ahead == 0:
            return 0
        if not 0 < ahead <= memory.slot_count:
            self._break(f"head {head} is not within one ring of the tail {tail}")
            return 0
        taken = min(ahead, limit)
        core = self._core
        frees = core.frees_of(self.client_id)
        if frees != self._frees:  # bound launches may name a freed buffer: let them go
            self._frees = frees
            self._bound.clear()
        batch = Batch(memory.records(tail, taken), tail)
        index = 0
        while index < taken:
            index += self._take_run(batch, index, taken)
            if self._copying is not None:  # started: nothing after it until it is over
                taken = index
                break
        self._tail = end = tail + taken
        # One watch per session and batch: its launches run in order on its stream, so
        # the newest one's end is the end of them all. Published after the launches are
        # enqueued, so a client that sees the tail move may call over gRPC in their order.
        client_id = self.client_id
        watches = [(s, w) for s in batch.launches if (w := core.newest_launch(client_id, s))]
        if self._observer is not None:
            for session_id, count in batch.launches.items():
                self._observer.launched(client_id, session_id, count)
        self._flights.append(_Flight(end, watches, batch.reap, self._copying))
        memory.set_u64(layout.TAIL, end)
        now = time.monotonic()
        if now - self._touched >= TOUCH_SECONDS:
            self._touched = now
            core.touch(client_id)
        return taken

    def _take_run(self, batch: Batch, index: int, count: int) -> int:
        """Take record ``index`` of the batch and the identical launches right after it,
        replayed at once when it was bound before; how many records that was."""
        at = index * layout.SLOT_SIZE
        records = batch.records
        seq = batch.first + index
        bound = None
        if records.startswith(LAUNCH_KIND, at + KIND) and batch.seq(index) == seq:
            key = records[at + KEY : at + KEY_END]
            bound = self._bound.get(key)
        if bound is None:
            batch.launched(self._one(seq, batch.slot(index)))
            return 1
        run = 1
        while index + run < count:
            following = at + run * layout.SLOT_SIZE
            if not (
                records.startswith(key, following + KEY)
                and records.startswith(LAUNCH_KIND, following + KIND)
                and batch.seq(index + run) == seq + run
            ):
                break
            run += 1
        try:
            replayed = self._core.launch_bound(bound.launch, run)
        except AccyError as error:
            for failed in range(seq, seq + run):
                self._refuse_launch(failed, error, bound.session_id)
            return run
        if replayed:
            batch.launched((bound.session_id, False), run)
            return run
        self._bound.clear()  # something it named changed: check each again
        for again in range(index, index + run):
            batch.launched(self._one(seq + again - index, batch.slot(again)))
        return run

    def _one(self, seq: int, raw: bytes) -> tuple[str, bool] | None:
        """Take one record; for a launch enqueued, its session and whether it must be reaped."""
        (got, kind, _flags, handle, n_ops, n_res, n_scalars, *rest) = layout.RECORD.unpack_from(raw)
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
                return self._launch(
                    raw[KEY:KEY_END],
                    handle,
                    handles[:n_ops],
                    handles[n_ops : n_ops + n_res],
                    n_scalars,
                    values,
                )
            if kind in (layout.Kind.BIND_SESSION, layout.Kind.BIND_BUFFER):
                self._bind(kind, handle, id_of(raw))
            elif kind == layout.Kind.COPY:
                self._copy(_flags, handle, values, id_of(raw))
            elif kind == layout.Kind.UNBIND:
                self._sessions.pop(handle, None)
                self._buffers.pop(handle, None)
                self._bound.clear()  # its keys name handles: one may be bound anew
            else:
                raise InvalidRequest(f"unknown record kind {kind}", field="kind")
        except AccyError as error:
            if kind == layout.Kind.LAUNCH:
                binding = self._sessions.get(handle)
                self._refuse_launch(seq, error, binding.session_id if binding else None)
            else:
                self._refuse(seq, error, self._named(kind, handle))
        return None

    def _refuse_launch(self, seq: int, error: AccyError, session_id: str | None) -> None:
        """Refuse a launch record (counted as a refused launch)."""
        what = f"launch of session {session_id}" if session_id else "launch"
        self._refuse(seq, error, what)
        if self._observer is not None:
            self._observer.refused(self.client_id, session_id, error)

    def _named(self, kind: int, handle: int) -> str:
        """What a refused record other than a launch was, for its message."""
        if kind == layout.Kind.COPY:
            return f"copy with buffer {self._buffers.get(handle, handle)}"
        return "binding" if kind != layout.Kind.UNBIND else "unbinding"

    def _copy(self, flags: int, handle: int, values: bytes, segment_id: str) -> None:
        """Start a COPY record on a copy thread; the ring takes nothing more until it is over."""
        buffer_id = self._buffer(handle, "buffer", 0)
        if self._copier is None:
            raise FailedPrecondition(
                "this daemon runs no ring copies: copy with CopySegment", field="kind"
            )
        self._copying = self._copier.start(self.client_id, flags, values, buffer_id, segment_id)

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

    def _launch(
        self,
        key: bytes,
        handle: int,
        operands: Sequence[int],
        results: Sequence[int],
        n_scalars: int,
        values: bytes,
    ) -> tuple[str, bool]:
        binding = self._sessions.get(handle)
        if binding is None:
            raise NotFound(f"no session bound to handle {handle}", field="session")
        if n_scalars != len(binding.specs):
            raise LaunchArgumentMismatch(
                f"session {binding.session_id} takes {len(binding.specs)} runtime scalars; "
                f"got {n_scalars}",
                field="runtime_scalars",
            )
        scalars = {
            spec.name: Scalar(spec.dtype, value)
            for spec, value in zip(binding.specs, binding.unpack.unpack(values), strict=True)
        }
        operand_ids = [self._buffer(h, "operands", i) for i, h in enumerate(operands)]
        result_ids = [self._buffer(h, "results", i) for i, h in enumerate(results)]
        core = self._core
        bound = core.bind_launch(
            self.client_id, binding.session_id, operand_ids, result_ids, scalars
        )
        if bound is not None and core.launch_bound(bound, 1):
            if len(self._bound) >= BOUND_PER_RING:
                self._bound.clear()
            self._bound[key] = _Bound(binding.session_id, bound)
            return binding.session_id, False
        ticket = core.launch(self.client_id, binding.session_id, operand_ids, result_ids, scalars)
        return binding.session_id, ticket.must_wait

    def _buffer(self, handle: int, role: str, index: int) -> str:
        buffer_id = self._buffers.get(handle)
        if buffer_id is None:
            raise NotFound(f"no buffer bound to handle {handle}", field=f"{role}[{index}]")
        return buffer_id

    # Completions -------------------------------------------------------------------

    def notify_settled(self, callback: Callable[[], None]) -> int:
        """Have ``callback`` called (from another thread) once the newest batch in flight is
        over: once per session it used. How many calls to expect (0: none was taken)."""
        if not self._flights:
            return 0
        return sum(watch.notify(callback) for _, watch in self._flights[-1].watches)

    def settle_for(self, seconds: float) -> bool:
        """Block up to ``seconds`` for the newest batch in flight, then ``settle``."""
        if self._flights and seconds > 0:
            until = time.monotonic() + seconds
            for _, watch in self._flights[-1].watches:
                watch.settle(until - time.monotonic())
        return self.settle()

    def settle(self) -> bool:
        """Advance ``done`` past every finished entry; whether it moved."""
        moved = False
        flights = self._flights
        while flights:
            flight = flights[0]
            if not all(watch.done() for _, watch in flight.watches):
                break
            copy = flight.copy
            if copy is not None:
                if not copy.done():
                    break
                try:
                    copy.outcome()
                except AccyError as error:
                    self._refuse(flight.end - 1, error, copy.what)
            for session_id, watch in flight.watches:
                try:
                    self._outcome(flight.end - 1, session_id, watch)
                finally:
                    watch.close()
            for session_id in flight.reap:
                self._core.reap(self.client_id, session_id)
            flights.popleft()
            self._done = flight.end
            moved = True
        if moved:
            self.memory.set_u64(layout.DONE, self._done)
            if self.memory.u32(layout.CLIENT_WAITS):
                self.memory.wake_client()
        return moved

    def _outcome(self, seq: int, session_id: str, watch: MarkWatch) -> None:
        """Write what a finished batch failed with, if anything, then have the core note it.

        The entry goes first: noting a device fault stops the daemon, and a client that
        hears of the stop before it reads the entry would not learn which session faulted.
        """
        what = f"launch of session {session_id}"
        try:
            watch.outcome()
        except DeviceFault as fault:
            self._refuse(seq, DeviceFault(fault.message, session=fault.session or session_id), what)
            with contextlib.suppress(AccyError):
                self._core.launch_outcome(session_id, watch)  # latches the fault
        except AccyError as error:
            self._refuse(seq, error, what)

    # Errors ---------------------------------------------------------------------------

    def _refuse(self, seq: int, error: AccyError, what: str = "record") -> None:
        if isinstance(error, DeviceFault) and not error.isolated:
            self.broken = True  # the daemon is going away; one device's fault spares the ring
        session = b""
        if isinstance(error, DeviceFault):
            session = layout.fault_origin(error.session, error.device if error.isolated else None)
        self.memory.write_entry(
            self._errors, seq, error.reason, error.field or "", session, f"{what}: {error.message}"
        )
        self._errors += 1
        self.memory.set_u64(layout.ERRORS, self._errors)
        log.info(
            "ring record refused",
            client_id=self.client_id,
            ring_id=self.id,
            seq=seq,
            reason=error.reason,
            error=error.message,
        )

    def _break(self, why: str) -> None:
        """A client that broke the ring's rules: refuse everything from now on."""
        self._refuse(self._tail, InvalidRequest(f"ring closed: {why}", field="head"))
        self.broken = True
        self.memory.set_u32(layout.CLOSED, 1)
        self.memory.wake_client()

    def close(self) -> None:
        """Let every mark go and unmap; the client's own mapping stays valid for it."""
        for flight in self._flights:
            for _, watch in flight.watches:
                watch.close()
        self._flights.clear()
        self.memory.close()
