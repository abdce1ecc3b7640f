"""Launches: check a launch's arguments, charge it, order it after its buffers' users, enqueue.

``Launching.launch`` is the one launch contract every front door calls, and it never
blocks its caller: a launch that needs scratch of its own (its session has no
``allocate_intermediates``) raises ``WouldBlock`` with the rest of the launch as
``finish``, checked and charged nothing yet, for the door to run off its thread (a
device-work thread within the client's share). Everything else is checked and
enqueued under the lock and returns at once.

A door that replays launches by itself (the ring engine) asks for ``ticket_for``: a
launch on the session's own scratch then comes back with a ``FastLaunch`` the door
may install as a ticket (``core/tickets.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from accyd.backends.base import DeviceBuffer, Stream
from accyd.catalog.dtypes import Scalar
from accyd.core.accounting import Reservation
from accyd.core.arguments import check_counts, hazards, launch_buffers, note
from accyd.core.buffers import BufferRecord
from accyd.core.clients import Client
from accyd.core.executor import (
    Intermediates,
    LaunchPlan,
    allocate_intermediates,
    intermediate_byte_sizes,
)
from accyd.core.marks import MarkWatch, order_after
from accyd.core.prepared import Prepared
from accyd.core.sessions import Session, order_scalars
from accyd.core.tables import Tables
from accyd.core.tenants import Usage
from accyd.core.tickets import FastLaunch, claim, note_ticketed
from accyd.errors import AccyError, DeviceFault, NotFound

__all__ = ["LaunchTicket", "Launching", "WouldBlock"]

_ONE_LAUNCH = Usage(launches_in_flight=1)
"""What a launch on the session's own scratch costs (never changed: shared by every launch)."""


class WouldBlock(Exception):
    """``launch`` would have to allocate scratch for this launch alone: nothing was done.

    ``finish()`` (*blocking*) checks the launch again, allocates its scratch and
    enqueues it; the door runs it off its own thread and the event loop."""

    def __init__(self, finish: Callable[[], LaunchTicket]) -> None:
        super().__init__("this launch allocates scratch of its own")
        self.finish = finish


@dataclass(frozen=True, slots=True)
class LaunchTicket:
    """An enqueued launch; ``must_wait`` when it runs on scratch made for it alone.

    The first five fields are plain data; ``stream``, ``watch`` and ``fast`` are handles
    for the door in the daemon's process that made the launch, taken with the enqueue
    under the lock (why they are not fetched by id later: docs/architecture.md)."""

    session_id: str
    launch_id: str
    must_wait: bool
    pipeline: str
    """The catalog target the session runs: a bounded label for metrics."""
    device: int
    stream: Stream
    """Where it runs: its end is the end of what that stream holds now."""
    watch: MarkWatch | None = None
    """For a launch made with ``watch=True``: the caller's hold on its end (it closes it)."""
    fast: FastLaunch | None = None
    """With ``ticket_for``: the launch as a ticket the door may install (``None``: none)."""


@dataclass(frozen=True, slots=True)
class _Checked:
    """A launch's arguments, checked: runtime scalars in order, buffers, its plan and, on
    the session's own scratch, its prepared launch."""

    args: tuple[Scalar, ...]
    operands: list[BufferRecord]
    results: list[BufferRecord]
    operand_buffers: list[DeviceBuffer]
    result_buffers: list[DeviceBuffer]
    plan: LaunchPlan
    entry: Prepared | None


class Launching:
    """The launch operation of the facade, over the core's ``Tables``."""

    def __init__(self, tables: Tables) -> None:
        self._t = tables
        self.launches_total = 0
        self.launches_failed = 0

    def launch(
        self,
        client_id: str,
        session_id: str,
        operands: Sequence[str],
        results: Sequence[str],
        scalars: Mapping[str, Scalar],
        *,
        watch: bool = False,
        ticket_for: object | None = None,
    ) -> LaunchTicket:
        """Check, then enqueue on the session's stream; returns at once (see the module).

        With ``watch``, the ticket holds a ``MarkWatch`` so the caller can learn of its end
        without blocking a thread; the caller closes it. ``ticket_for`` names the ring that
        would launch the same launch again by itself.
        """
        t = self._t
        try:
            with t.lock:
                t.state.check_serving()
                client, session = t.session(client_id, session_id)
                if t.state.lost:
                    t.state.check_alive(session.key.device)
                if not session.needs_scratch or session.scratch is not None:
                    checked = self._check(client, session, operands, results, scalars)
                    t.ledger.launches_over(client, session.reap(free_scratch=False).launches)
                    with t.ledger.reserve(client, _ONE_LAUNCH) as held:
                        ticket = self._enqueue(held, session, checked, None, watch, ticket_for)
                    self.launches_total += 1
                    return ticket
                self._check(client, session, operands, results, scalars)  # refused here first
        except AccyError:
            self.launches_failed += 1
            raise

        def finish() -> LaunchTicket:
            try:
                ticket = self._launch_on_own_scratch(client, session, operands, results, scalars)
            except AccyError:
                self.launches_failed += 1
                raise
            self.launches_total += 1
            return ticket

        raise WouldBlock(finish)

    def _launch_on_own_scratch(
        self,
        client: Client,
        session: Session,
        operands: Sequence[str],
        results: Sequence[str],
        scalars: Mapping[str, Scalar],
    ) -> LaunchTicket:
        t = self._t
        args = order_scalars(session.pipeline, scalars)
        session.pipeline.validate_runtime_scalars(args)
        size = sum(intermediate_byte_sizes(session.pipeline, args))
        with t.ledger.reserve(client, Usage(memory_bytes=size, launches_in_flight=1)) as held:
            with t.state.guard(session.id, session.backend):  # outside the lock: may be slow
                transient = allocate_intermediates(session.backend, session.pipeline, args)
            with t.lock:
                try:  # checked again: buffers or the session may have gone meanwhile
                    t.state.check_serving()
                    t.check_attached(client)
                    if client.session(session.id) is not session:
                        raise NotFound(f"no session {session.id!r}", field="session_id")
                    checked = self._check(client, session, operands, results, scalars)
                except BaseException:
                    transient.close()
                    raise
                return self._enqueue(held, session, checked, transient, False, None)

    def _enqueue(
        self,
        held: Reservation,
        session: Session,
        checked: _Checked,
        transient: Intermediates | None,
        watch: bool,
        ticket_for: object | None,
    ) -> LaunchTicket:
        """Order after the buffers' hazards and enqueue (under the lock); keeps ``held``."""
        t = self._t
        ops, res = checked.operands, checked.results
        before = session.next_seq
        try:
            claim(session, ops, res, t.revoker)
            order_after(session.backend, session.stream, hazards(ops, res))
            record = session.enqueue(
                checked.operand_buffers,
                checked.result_buffers,
                checked.args,
                transient,
                checked.plan,
                checked.entry,
            )
        except BaseException as error:
            parked = session.newest(before)
            if parked is not None:  # it may have run part way: it stays in the log, charged
                held.keep()
                note(parked.mark, ops, res)
            if isinstance(error, DeviceFault):
                raise t.state.noted(error, session.id, session.backend) from error
            raise
        held.keep()
        note(record.mark, ops, res)
        fast = None
        if ticket_for is not None and checked.entry is not None:
            fast = self._ticket(session, checked.entry, ticket_for)
        return LaunchTicket(
            session.id,
            session.launch_id(record.seq),
            transient is not None,
            session.pipeline.target,
            session.key.device,
            session.stream,
            MarkWatch(record.mark, session.stream) if watch and transient is None else None,
            fast,
        )

    def _ticket(self, session: Session, entry: Prepared, ring: object) -> FastLaunch | None:
        """Under the lock, right after ``entry`` was launched here (so no ticket holds it):
        hand it to ``ring`` as a ticket, if the engine takes tickets."""
        revoker = self._t.revoker
        if not revoker.ticketing or entry.launch is None:
            return None
        if entry.epoch is None:
            entry.epoch = revoker.new_epoch()
            if entry.epoch is None:
                return None
        entry.holder = ring
        note_ticketed(entry, session)
        return FastLaunch(
            session.id,
            entry.launch,
            session.stream,
            session.key.device,
            entry.epoch,
            revoker.epoch_value(entry.epoch),
            session.prepared.free,
        )

    def _check(
        self,
        client: Client,
        session: Session,
        operands: Sequence[str],
        results: Sequence[str],
        scalars: Mapping[str, Scalar],
    ) -> _Checked:
        """Every check of a launch about the caller's arguments, then about its scratch."""
        pipeline = session.pipeline
        check_counts(pipeline, len(operands), len(results))
        args = order_scalars(pipeline, scalars)
        device = session.key.device
        ops = launch_buffers(client, device, "operands", pipeline.operands, operands)
        res = launch_buffers(client, device, "results", pipeline.results, results)
        op_buffers = [record.buffer for record in ops]
        res_buffers = [record.buffer for record in res]
        key = session.cache_key(op_buffers, res_buffers, args)
        entry = None if key is None else session.prepared.find(key)
        if entry is not None:  # these buffers and scalars were checked on this scratch
            return _Checked(args, ops, res, op_buffers, res_buffers, entry.plan, entry)
        plan = session.plan(op_buffers, res_buffers, args)
        if key is not None:
            session.scratch_for(args)  # too small for these scalars: refused, naming them
            uses = tuple((r, False) for r in ops if r not in res) + tuple((r, True) for r in res)
            entry = session.prepared.add(key, Prepared(session, plan, None, uses))
        return _Checked(args, ops, res, op_buffers, res_buffers, plan, entry)
