"""Tickets: what the core asks of a launch engine that replays checked launches by itself.

A ring door's engine (``accyd.ring.engine``) may launch a record without Python when it
matches a *ticket*: a launch the core checked in full once, whose prepared launch
(the one cache of "the same launch again", ``core/prepared.py``) it installed. The
core stays the only authority on what may run, through three things:

- **Epochs.** Each prepared launch with a ticket holds an epoch slot; every event that
  can make the ticket stale (a buffer it names freed or lost, its session released or
  its scratch replaced, its device replaced, another session or a Python launch
  needing the buffers or the graph) revokes it: the slot is bumped and the engine is
  quiesced, so no launch checked against the old value can still be made.
- **Uses.** A buffer remembers which sessions' tickets read or write it
  (``BufferRecord.ticketed``) and which sessions' engine launches may have touched it
  since Python last looked (``BufferRecord.engine``). Anything Python does to the
  buffer from another stream first revokes conflicting tickets, then *absorbs* those
  launches: a fresh mark recorded on each such session's stream now covers every
  engine launch enqueued so far, and goes into the buffer's hazards.
- **Counters.** Launches in flight are counted on both paths against one limit
  (``EngineCounts``).

Without an engine (``NO_TICKETS``) none of this is used: nothing is ticketed.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from accyd.backends.base import Backend, PreparedLaunch, Stream
from accyd.core.free_scalars import FreeScalars
from accyd.core.marks import Mark

__all__ = [
    "NO_TICKETS",
    "EngineUser",
    "FastLaunch",
    "Revoker",
    "TicketEntry",
    "UsedBuffer",
    "absorb",
    "claim",
    "note_ticketed",
    "revoke",
]


class EngineUser(Protocol):
    """A session, as the tickets' bookkeeping sees it (``core/sessions.py``'s ``Session``)."""

    engine_touched: bool

    @property
    def closed(self) -> bool: ...

    @property
    def backend(self) -> Backend: ...

    @property
    def stream(self) -> Stream: ...


class UsedBuffer(Protocol):
    """A buffer, as the tickets' bookkeeping sees it (``core/buffers.py``'s ``BufferRecord``)."""

    @property
    def ticketed(self) -> dict[TicketEntry, bool]: ...

    @property
    def engine(self) -> dict[EngineUser, bool]: ...

    def note_write(self, mark: Mark) -> None: ...

    def note_read(self, mark: Mark) -> None: ...


class TicketEntry(Protocol):
    """A prepared launch, as its tickets see it (``core/prepared.py``'s ``Prepared``)."""

    holder: object | None

    @property
    def session(self) -> EngineUser: ...

    @property
    def epoch(self) -> int | None: ...

    @property
    def uses(self) -> Sequence[tuple[UsedBuffer, bool]]: ...


class Revoker(Protocol):
    """What the core needs of an engine's tickets: epochs to make them stale."""

    @property
    def ticketing(self) -> bool:
        """Whether the engine launches tickets at all (else nothing is ticketed)."""
        ...

    def new_epoch(self) -> int | None:
        """An epoch slot for a prepared launch's tickets (``None``: none left)."""
        ...

    def epoch_value(self, epoch: int) -> int: ...

    def revoke(self, epochs: Collection[int]) -> None:
        """Make every ticket of ``epochs`` stale; returns once none can launch again."""
        ...

    def free_epoch(self, epoch: int) -> None:
        """Give a slot back (revoked first: its tickets are stale for good)."""
        ...


class _NoTickets:
    """The core without a ticketing engine: nothing is ticketed, nothing to revoke."""

    ticketing = False

    def new_epoch(self) -> int | None:
        return None

    def epoch_value(self, epoch: int) -> int:
        return 0

    def revoke(self, epochs: Collection[int]) -> None:
        return None

    def free_epoch(self, epoch: int) -> None:
        return None


NO_TICKETS: Revoker = _NoTickets()


@dataclass(frozen=True, slots=True)
class FastLaunch:
    """What a door installs as a ticket for a launch the core checked: the prepared launch
    to replay, on which stream and device, valid while ``epoch`` holds ``value``. With
    ``free``, it serves every value of those scalars: the door has the prepared launch take
    each launch's values first (``PreparedLaunch.set_scalars``)."""

    session_id: str
    launch: PreparedLaunch
    stream: Stream
    device: int
    epoch: int
    value: int
    free: FreeScalars | None = None


def note_ticketed(prepared: TicketEntry, session: EngineUser) -> None:
    """Under the lock: ``prepared``'s buffers are named by a live ticket of ``session``."""
    session.engine_touched = True
    for record, writes in prepared.uses:
        record.ticketed[prepared] = writes or record.ticketed.get(prepared, False)
        record.engine[session] = writes or record.engine.get(session, False)


def claim(
    session: EngineUser,
    operands: Sequence[UsedBuffer],
    results: Sequence[UsedBuffer],
    revoker: Revoker,
) -> None:
    """Under the lock, before a launch of ``session`` that Python enqueues: revoke the
    tickets of other sessions that conflict with it on these buffers (one writes what the
    other uses), then absorb their launches so the buffers' hazards cover them."""
    stale: list[TicketEntry] = []
    for records, writes in ((operands, False), (results, True)):
        for record in records:
            for prepared, their_writes in record.ticketed.items():
                if prepared.session is not session and (writes or their_writes):
                    stale.append(prepared)
    if stale:
        revoke(stale, revoker)
    for record in (*operands, *results):
        if record.engine:
            absorb(record, revoker, but=session)


def revoke(entries: Collection[TicketEntry], revoker: Revoker) -> None:
    """Under the lock: make the tickets of ``entries`` stale (their graphs stay)."""
    epochs = [p.epoch for p in entries if p.epoch is not None]
    if epochs:
        revoker.revoke(epochs)
    for prepared in entries:
        prepared.holder = None
        for record, _ in prepared.uses:
            record.ticketed.pop(prepared, None)


def absorb(record: UsedBuffer, revoker: Revoker, *, but: EngineUser | None = None) -> None:
    """Under the lock: note on ``record`` a fresh mark on the stream of each session whose
    engine launches may have used it (``but`` excepted: a launch on its own stream is in
    order already), so its hazards cover every launch the engine enqueued so far.

    Callers that need no later engine launch to use the buffer revoked its tickets
    first; a session with no live ticket naming it is forgotten after this."""
    live = {p.session for p in record.ticketed}
    for session, writes in list(record.engine.items()):
        if session is but:
            continue
        if not session.closed:
            mark = Mark(session.backend, session.stream)
            if writes:
                record.note_write(mark)
            else:
                record.note_read(mark)
            mark.release()
        if session not in live:
            del record.engine[session]
