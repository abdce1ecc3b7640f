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
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

from accy.protocol import ring as layout
from accyd.catalog.dtypes import DType, Scalar
from accyd.catalog.model import ScalarSpec
from accyd.core.launching import BoundLaunch
from accyd.core.marks import MarkWatch
from accyd.errors import AccyError, DeviceFault, InvalidRequest, LaunchArgumentMismatch, NotFound
from accyd.ring.memory import RingMemory

__all__ = ["RingCore", "ServerRing"]

log = structlog.get_logger("accyd.ring")

_CODES = {
    DType.F32: "f4x",
    DType.F64: "d",
    DType.I32: "i4x",
    DType.U32: "I4x",
    DType.I64: "q",
    DType.U64: "Q",
    DType.U8: "B7x",
}


class Ticket(Protocol):
    @property
    def must_wait(self) -> bool: ...

    @property
    def watch(self) -> MarkWatch | None: ...


class RingCore(Protocol):
    """What a ring needs of the core: the operations every front door calls."""

    def launch(
        self,
        client_id: str,
        session_id: str,
        operands: Sequence[str],
        results: Sequence[str],
        scalars: Mapping[str, Scalar],
        *,
        watch: bool = False,
    ) -> Ticket: ...

    def reap(self, client_id: str, session_id: str) -> None: ...

    def bind_launch(
        self,
        client_id: str,
        session_id: str,
        operands: Sequence[str],
        results: Sequence[str],
        scalars: Mapping[str, Scalar],
    ) -> BoundLaunch | None: ...

    def launch_bound(self, bound: BoundLaunch, count: int = 1) -> bool: ...

    def newest_launch(self, client_id: str, session_id: str) -> MarkWatch | None: ...

    def launch_outcome(self, session_id: str, watch: MarkWatch) -> None: ...

    def session_scalars(self, client_id: str, session_id: str) -> tuple[ScalarSpec, ...]: ...

    def check_buffer(self, client_id: str, buffer_id: str) -> None: ...

    def touch(self, client_id: str) -> None: ...

    def frees_of(self, client_id: str) -> int: ...


BOUND_PER_RING = 1024
"""Launches a ring keeps checked (by record contents); past this it starts over."""

_KEY = slice(12, layout.RECORD.size)
"""The bytes of a launch record that say what it launches: handles, counts and scalars."""
_KIND = slice(8, 10)
_LAUNCH_KIND = int(layout.Kind.LAUNCH).to_bytes(2, "little")


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


class ServerRing:
    """The daemon's view of one client's ring; used only by the submitter thread.

    Owns its ``RingMemory`` and the marks of its launches in flight (each a
    ``MarkWatch`` it closes once the launch is over, or in ``close()``).
    """

    def __init__(self, ring_id: str, client_id: str, memory: RingMemory, core: RingCore) -> None:
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
        self._frees = 0
        """Launches checked once, by their records' contents: replayed without a check."""
        self.broken = False

    @property
    def in_flight(self) -> bool:
        return bool(self._flights)

    def pending(self) -> bool:
        """Records published and not taken yet."""
        return not self.broken and self.memory.u64(layout.HEAD) != self._tail

    # Taking records -------------------------------------------------------------

    def take(self, limit: int) -> int:
        """Check and enqueue up to ``limit`` published records; how many were taken."""
        if self.broken:
            return 0
        head = self.memory.u64(layout.HEAD)
        ahead = head - self._tail
        if ahead == 0:
            return 0
        if not 0 < ahead <= self.memory.slot_count:
            self._break(f"head {head} is not within one ring of the tail {self._tail}")
            return 0
        taken = min(ahead, limit)
        frees = self._core.frees_of(self.client_id)
        if frees != self._frees:  # bound launches may name a freed buffer: let them go
            self._frees = frees
            self._bound.clear()
        sessions: set[str] = set()
        reap: set[str] = set()
        seq, end = self._tail, self._tail + taken
        while seq < end:
            run, launched = self._take_run(seq, end)
            if launched is not None:
                sessions.add(launched[0])
                if launched[1]:
                    reap.add(launched[0])
            seq += run
        self._tail += taken
        # One watch per session and batch: its launches run in order on its stream, so
        # the newest one's end is the end of them all. Published after the launches are
        # enqueued, so a client that sees the tail move may call over gRPC in their order.
        watches = [(s, w) for s in sessions if (w := self._core.newest_launch(self.client_id, s))]
        self._flights.append(_Flight(self._tail, watches, reap))
        self.memory.set_u64(layout.TAIL, self._tail)
        self._core.touch(self.client_id)
        return taken

    def _take_run(self, seq: int, end: int) -> tuple[int, tuple[str, bool] | None]:
        """Take record ``seq`` and the identical launches right after it, replayed at once
        when it was bound before; how many records, and what ``_one`` says of them."""
        raw = self.memory.record(seq)
        key = raw[_KEY]
        bound = self._bound.get(key) if raw[_KIND] == _LAUNCH_KIND else None
        if bound is None or int.from_bytes(raw[:8], "little") != seq:
            return 1, self._one(seq, raw)
        run = 1
        while seq + run < end:
            following = self.memory.record(seq + run)
            if following[_KEY] != key or following[_KIND] != _LAUNCH_KIND:
                break
            if int.from_bytes(following[:8], "little") != seq + run:
                break
            run += 1
        try:
            replayed = self._core.launch_bound(bound.launch, run)
        except AccyError as error:
            for failed in range(seq, seq + run):
                self._refuse(failed, error, f"launch of session {bound.session_id}")
            return run, None
        if not replayed:  # something it named changed: check each again
            self._bound.clear()
            for again in range(seq, seq + run):
                launched = self._one(again, self.memory.record(again))
            return run, launched
        return run, (bound.session_id, False)

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
                    raw[_KEY],
                    handle,
                    handles[:n_ops],
                    handles[n_ops : n_ops + n_res],
                    n_scalars,
                    values,
                )
            if kind in (layout.Kind.BIND_SESSION, layout.Kind.BIND_BUFFER):
                self._bind(kind, handle, _id_of(raw))
            elif kind == layout.Kind.UNBIND:
                self._sessions.pop(handle, None)
                self._buffers.pop(handle, None)
                self._bound.clear()  # its keys name handles: one may be bound anew
            else:
                raise InvalidRequest(f"unknown record kind {kind}", field="kind")
        except AccyError as error:
            self._refuse(seq, error, self._named(kind, handle))
        return None

    def _named(self, kind: int, handle: int) -> str:
        """What a refused record was, for its message: "launch of session ..." and so on."""
        if kind == layout.Kind.LAUNCH:
            binding = self._sessions.get(handle)
            return f"launch of session {binding.session_id}" if binding else "launch"
        return "binding" if kind != layout.Kind.UNBIND else "unbinding"

    def _bind(self, kind: int, handle: int, object_id: str) -> None:
        if handle in self._sessions or handle in self._buffers:
            raise InvalidRequest(f"handle {handle} is bound already", field="handle")
        if kind == layout.Kind.BIND_SESSION:
            specs = self._core.session_scalars(self.client_id, object_id)
            if len(specs) > layout.MAX_SCALARS:
                raise LaunchArgumentMismatch(
                    f"session {object_id} takes {len(specs)} runtime scalars; "
                    f"the ring carries at most {layout.MAX_SCALARS}",
                    field="session_id",
                )
            code = "<" + "".join(_CODES[s.dtype] for s in specs)
            code += f"{8 * (layout.MAX_SCALARS - len(specs))}x"
            self._sessions[handle] = _SessionBinding(object_id, specs, struct.Struct(code))
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

    def settle(self) -> bool:
        """Advance ``done`` past every finished entry; whether it moved."""
        moved = False
        flights = self._flights
        while flights:
            flight = flights[0]
            if not all(watch.done() for _, watch in flight.watches):
                break
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
        field = (error.field or "").encode()[: layout.FIELD_BYTES]
        message = f"{what}: {error.message}".encode()[: layout.MESSAGE_BYTES]
        at = layout.ERROR_BASE + (self._errors % layout.error_slots()) * layout.ERROR_SIZE
        session = b""
        if isinstance(error, DeviceFault):
            session = layout.fault_origin(error.session, error.device if error.isolated else None)
        layout.ERROR_ENTRY.pack_into(
            self.memory.map, at, seq, error.reason.encode()[:32], field, session, len(message)
        )
        start = at + layout.ERROR_ENTRY.size
        self.memory.map[start : start + len(message)] = message
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


def _id_of(raw: bytes) -> str:
    length = raw[layout.ID_OFFSET]
    if not 0 < length <= layout.MAX_ID_BYTES:
        raise InvalidRequest(f"id length {length} is not 1..{layout.MAX_ID_BYTES}", field="id")
    start = layout.ID_OFFSET + 1
    try:
        return raw[start : start + length].decode("ascii")
    except UnicodeDecodeError:
        raise InvalidRequest("an id is ASCII", field="id") from None
