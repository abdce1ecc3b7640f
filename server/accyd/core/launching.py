"""Launches: check a launch's arguments, charge it, order it after its buffers' users, enqueue.

``launch`` is the hot path (a same-host ring calls it tens of thousands of
times a second): one lock, no logging, and allocations kept to the launch's
own record. Scratch made for one launch alone is allocated outside the lock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from accyd.backends.base import DeviceBuffer, PreparedLaunch
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
from accyd.core.holdings import WouldBlock
from accyd.core.marks import MarkWatch, order_after
from accyd.core.replacing import Replacing
from accyd.core.sessions import Session, order_scalars
from accyd.core.tenants import Usage
from accyd.errors import AccyError, DeviceFault, NotFound

__all__ = ["BoundLaunch", "LaunchTicket", "Launching"]

_ONE_LAUNCH = Usage(launches_in_flight=1)
REAP_AFTER = 16
"""A bound replay reaps its session's finished launches (giving their quota back) once
this many records are in flight, not at every replay."""
"""What a launch on the session's own scratch costs (never changed: shared by every launch)."""


@dataclass(frozen=True, slots=True)
class LaunchTicket:
    """An enqueued launch; ``must_wait`` when it runs on scratch made for it alone."""

    session_id: str
    launch_id: str
    must_wait: bool
    pipeline: str
    """The catalog target the session runs: a bounded label for metrics."""
    watch: MarkWatch | None = None
    """For a launch made with ``watch=True``: the caller's hold on its end (it closes it)."""


@dataclass(frozen=True, eq=False, slots=True)
class BoundLaunch:
    """A launch checked once, replayed by ``Launching.launch_bound`` while all it names lives.

    Made by ``bind_launch``; holds no device resource (the session's prepared-launch
    cache owns the graph), so dropping it frees nothing.
    """

    client: Client
    session: Session
    checked: _Checked
    scratch: Intermediates | None
    """The session's scratch when it was bound: replaced scratch makes it stale."""
    prepared: _Held = field(default_factory=lambda: _Held())
    """Its prepared launch, kept while the session's prepared launches stay the same."""
    frees: int = -1
    """The client's ``frees`` when it was bound: unchanged, every buffer it names is alive."""


class _Held:
    """A bound launch's prepared launch and the generation it was taken at."""

    __slots__ = ("generation", "launch")

    def __init__(self) -> None:
        self.launch: PreparedLaunch | None = None
        self.generation = -1


class Launching(Replacing):
    """The launch operations of the facade."""

    launches_total = 0
    launches_failed = 0

    def launch(
        self,
        client_id: str,
        session_id: str,
        operands: Sequence[str],
        results: Sequence[str],
        scalars: Mapping[str, Scalar],
        *,
        watch: bool = False,
        may_block: bool = True,
    ) -> LaunchTicket:
        """Check, then enqueue on the session's stream; returns at once.

        With ``watch``, the ticket holds a ``MarkWatch`` (unless the launch runs on
        scratch of its own, ``must_wait``), so the caller can learn of its end
        without blocking a thread; the caller closes it. A session without scratch
        of its own gets scratch made for this launch alone: that allocation may
        block, so with ``may_block`` false such a launch raises ``WouldBlock``
        (checked, nothing done) for the caller to repeat off the event loop.
        """
        try:
            with self._lock:
                self._state.check_serving()
                client, session = self._session(client_id, session_id)
                if self._state.lost:
                    self._state.check_alive(session.key.device)
                checked = self._check_launch(client, session, operands, results, scalars)
                self._ledger.launches_over(client, session.reap(free_scratch=False).launches)
                if session.scratch_for(checked.args) is not None or not session.needs_scratch:
                    with self._ledger.reserve(client, _ONE_LAUNCH) as held:
                        ticket = self._enqueue(held, session, checked, None, watch)
                    self.launches_total += 1
                    return ticket
            if not may_block:
                raise WouldBlock("this launch allocates scratch of its own")
            ticket = self._launch_on_own_scratch(client, session, operands, results, scalars)
        except AccyError:
            self.launches_failed += 1
            raise
        self.launches_total += 1
        return ticket

    def bind_launch(
        self,
        client_id: str,
        session_id: str,
        operands: Sequence[str],
        results: Sequence[str],
        scalars: Mapping[str, Scalar],
    ) -> BoundLaunch | None:
        """Every check of ``launch``, once, for a front door that will repeat this launch.

        ``None`` when the launch cannot be replayed (it needs scratch of its own):
        the caller launches it with ``launch`` each time.
        """
        with self._lock:
            self._state.check_serving(None)
            client, session = self._session(client_id, session_id)
            self._state.check_alive(session.key.device)
            checked = self._check_launch(client, session, operands, results, scalars)
            if session.needs_scratch and session.scratch_for(checked.args) is None:
                return None
            return BoundLaunch(client, session, checked, session.scratch, frees=client.frees)

    def launch_bound(self, bound: BoundLaunch, count: int = 1) -> bool:
        """Enqueue ``count`` replays of a bound launch; False when it went stale (a buffer
        freed, the session released or its scratch replaced, the client detached), and
        nothing was done: bind again. Quotas and hazards are checked as ``launch`` checks
        them; the replays are one record in the session's log."""
        client, session, checked = bound.client, bound.session, bound.checked
        with self._lock:
            buffers = client.buffers
            if (
                self._clients.find(client.id) is not client
                or client.sessions.get(session.id) is not session
                or session.scratch is not bound.scratch
                or (
                    client.frees != bound.frees  # a buffer went: is it one of these?
                    and (
                        any(buffers.get(r.id) is not r for r in checked.operands)
                        or any(buffers.get(r.id) is not r for r in checked.results)
                    )
                )
            ):
                return False
            try:
                self._state.check_serving()
                if session.launches_in_flight >= REAP_AFTER:  # tidying: not every replay
                    self._ledger.launches_over(client, session.reap(free_scratch=False).launches)
                with self._ledger.reserve(client, Usage(launches_in_flight=count)) as held:
                    self._replay(held, bound, count)
            except AccyError:
                self.launches_failed += count
                raise
            self.launches_total += count
            return True

    def _replay(self, held: Reservation, bound: BoundLaunch, count: int) -> None:
        session, checked, kept = bound.session, bound.checked, bound.prepared
        ops, res = checked.operands, checked.results
        before = session.next_seq
        try:
            order_after(session.backend, session.stream, hazards(ops, res))
            prepared = kept.launch
            if prepared is None or kept.generation != session.prepared.generation:
                prepared = session.prepared_for(
                    checked.operand_buffers, checked.result_buffers, checked.args, checked.plan
                )
                kept.launch, kept.generation = prepared, session.prepared.generation
            record = session.replay(prepared, count)
        except BaseException as error:
            parked = session.newest(before)
            if parked is not None:
                held.keep()
                note(parked.mark, ops, res)
            if isinstance(error, DeviceFault):
                raise self._state.noted(error, session.id, session.backend) from error
            raise
        held.keep()
        note(record.mark, ops, res)

    def _launch_on_own_scratch(
        self,
        client: Client,
        session: Session,
        operands: Sequence[str],
        results: Sequence[str],
        scalars: Mapping[str, Scalar],
    ) -> LaunchTicket:
        args = order_scalars(session.pipeline, scalars)
        session.pipeline.validate_runtime_scalars(args)
        size = sum(intermediate_byte_sizes(session.pipeline, args))
        with self._ledger.reserve(client, Usage(memory_bytes=size, launches_in_flight=1)) as held:
            with self._state.guard(session.id, session.backend):  # outside the lock: may be slow
                transient = allocate_intermediates(session.backend, session.pipeline, args)
            with self._lock:
                try:  # checked again: buffers or the session may have gone meanwhile
                    self._state.check_serving()
                    self._attached(client)
                    if client.session(session.id) is not session:
                        raise NotFound(f"no session {session.id!r}", field="session_id")
                    checked = self._check_launch(client, session, operands, results, scalars)
                except BaseException:
                    transient.close()
                    raise
                return self._enqueue(held, session, checked, transient, False)

    def _enqueue(
        self,
        held: Reservation,
        session: Session,
        checked: _Checked,
        transient: Intermediates | None,
        watch: bool,
    ) -> LaunchTicket:
        """Order after the buffers' hazards and enqueue (under the lock); keeps ``held``."""
        ops, res = checked.operands, checked.results
        before = session.next_seq
        try:
            order_after(session.backend, session.stream, hazards(ops, res))
            record = session.enqueue(
                checked.operand_buffers,
                checked.result_buffers,
                checked.args,
                transient,
                checked.plan,
            )
        except BaseException as error:
            parked = session.newest(before)
            if parked is not None:  # it may have run part way: it stays in the log, charged
                held.keep()
                note(parked.mark, ops, res)
            if isinstance(error, DeviceFault):
                raise self._state.noted(error, session.id, session.backend) from error
            raise
        held.keep()
        note(record.mark, ops, res)
        return LaunchTicket(
            session.id,
            session.launch_id(record.seq),
            transient is not None,
            session.pipeline.target,
            MarkWatch(record.mark, session.stream) if watch and transient is None else None,
        )

    def _check_launch(
        self,
        client: Client,
        session: Session,
        operands: Sequence[str],
        results: Sequence[str],
        scalars: Mapping[str, Scalar],
    ) -> _Checked:
        """Every check of a launch about the caller's arguments, before any about scratch."""
        pipeline = session.pipeline
        check_counts(pipeline, len(operands), len(results))
        args = order_scalars(pipeline, scalars)
        device = session.key.device
        ops = launch_buffers(client, device, "operands", pipeline.operands, operands)
        res = launch_buffers(client, device, "results", pipeline.results, results)
        op_buffers = [record.buffer for record in ops]
        res_buffers = [record.buffer for record in res]
        plan = session.check(op_buffers, res_buffers, args)
        return _Checked(args, ops, res, op_buffers, res_buffers, plan)


@dataclass(frozen=True, slots=True)
class _Checked:
    """A launch's arguments, checked: runtime scalars in order, buffers, and its plan."""

    args: tuple[Scalar, ...]
    operands: list[BufferRecord]
    results: list[BufferRecord]
    operand_buffers: list[DeviceBuffer]
    result_buffers: list[DeviceBuffer]
    plan: LaunchPlan
