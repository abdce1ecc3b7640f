"""The client's transport seam: how one link's launches and buffer bytes travel.

As in httpx, a connection gets one ``Transport`` and the API objects never ask
which one: ``Session``, ``Buffer`` and ``Launch`` hand it request values
(``LaunchRequest``, ``WaitRequest``, ``WriteRequest``, ``ReadRequest``,
``CopyRequest``) and import no transport module. One transport per link (an
attachment to one daemon instance), chosen once by
``accy._link_transport.open_transport`` from the target and the environment, or
given to ``Client(transport=...)`` (``accy.testing.FakeTransport``):

- launches: the shared ring (a Unix socket), the ring over a ``RingStream`` call
  (TCP, or ``ACCY_RING=stream``), or unary ``Launch`` calls (``ACCY_RING=0``, or
  a daemon that hands out no rings: ``--no-rings``). A ring is opened by the
  link's first launch; one the daemon refuses falls back to the next way.
- bytes: memory shared with a local daemon (``ACCY_SHM``, ``Client(shared_memory=)``)
  for large transfers and shared arrays, else streamed ``WriteBuffer`` and
  ``ReadBuffer`` calls. Shared memory falls back to those where the daemon
  shares none or its segments ran out; its copies are ``copy`` requests.

Every launch comes back as a ``Ticket``, whichever way it went; ``Launch`` wraps it.
The requests are ``NamedTuple``s: frozen values like a frozen dataclass, made in a
fifth of the time (0.3 µs against 1.8 µs here), and every launch makes one.

A transport learns the ids a launch names from the objects themselves
(``Session._id_on``, ``Buffer._buffer_id_on``: loading a session again, or refusing a
buffer that was lost, on the way); only this module's ``session_id_on`` and
``ids_of`` call those hooks.

The one cache. A ring transport keeps one packed record per plan: the fixed part of
a launch's ring record (kind, handles, counts) and its scalars' packer, keyed by the
session and buffer objects the launch names (their ``id()``s: no lookup, no check
is made again for the same objects). Its one invalidation rule is an epoch: a record
is good only for the epoch it was made in, and the epoch moves whenever something a
record may name goes away: ``forget`` of a bound session or buffer (a release, a
free, a collected object's safety net, a session loaded again under a new id, a
buffer marked lost). So an object that CPython puts at a dead one's address never
passes for it; buffer ids given as strings are never keyed (a string holds no
handle). Bindings (id to handle) live as long as their object is not forgotten; the
records are dropped wholesale past ``RECORDS_KEPT``. The unary transport keeps
nothing: a call costs a hundred times the packing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np

from accy._chunks import Progress
from accy._models import PipelineInfo
from accy.errors import FieldViolation, InvalidArgument

__all__ = [
    "CLOSE_DRAIN_SECONDS",
    "RECORDS_KEPT",
    "BufferRef",
    "CopyRequest",
    "LaunchOwner",
    "LaunchRequest",
    "ReadRequest",
    "Ticket",
    "Transport",
    "WaitRequest",
    "Waiter",
    "WriteRequest",
    "ids_of",
    "session_id_on",
]

CLOSE_DRAIN_SECONDS = 10.0
"""How long closing the client waits for the daemon to take the launches sent without
waiting (a ring over a stream: they are in flight on the wire)."""
RECORDS_KEPT = 256
"""Packed records (plans) a ring transport keeps; past this it starts over."""


class Named(Protocol):
    """A buffer as a launch names it: its id for a call on a link."""

    def _buffer_id_on(self, link: Any) -> str: ...


BufferRef = Named | str
"""A launch's operand or result: a ``Buffer``, or a buffer id."""


class LaunchOwner(Protocol):
    """What a transport needs of the session it launches (a ``Session``)."""

    info: PipelineInfo

    @property
    def id(self) -> str:
        """Its id now (for messages)."""
        ...

    def _id_on(self, link: Any) -> str:
        """The session's id on ``link``; raises why it cannot launch there."""
        ...


class LaunchRequest(NamedTuple):
    """One launch: check and send it (with ``wait``, return once it finished)."""

    session: LaunchOwner
    operands: Sequence[BufferRef]
    results: Sequence[BufferRef]
    scalars: Mapping[str, object]
    wait: bool
    timeout: Any
    """Seconds, ``None`` (no limit) or ``UNSET`` (the client's)."""


class WaitRequest(NamedTuple):
    """Until ``ticket``'s launch finished; without a ticket, every launch of ``session_id``
    so far; with neither, until the daemon took every launch sent (so a call after it is
    ordered after them)."""

    ticket: Ticket | None
    session_id: str | None
    timeout: float | None


class WriteRequest(NamedTuple):
    """Upload ``data`` to a buffer at byte ``offset``."""

    buffer_id: str
    device: int
    data: memoryview
    offset: int
    timeout: float | None
    chunk_size: int
    progress: Progress | None


class ReadRequest(NamedTuple):
    """Download ``size`` bytes of a buffer from byte ``offset``, into ``into`` (a
    C-contiguous array of that many bytes) where given."""

    buffer_id: str
    device: int
    offset: int
    size: int
    into: np.ndarray[Any, Any] | None
    timeout: float | None
    chunk_size: int
    progress: Progress | None


class CopyRequest(NamedTuple):
    """Have the daemon copy ``size`` bytes between a shared segment and a buffer."""

    segment_id: str
    segment_offset: int
    buffer_id: str
    buffer_offset: int
    size: int
    to_buffer: bool
    """Into the buffer (a write); else into the segment (a read)."""
    timeout: float | None


class Waiter(Protocol):
    """The part of a transport that waits for its tickets."""

    def wait(self, request: WaitRequest) -> None: ...


class Ticket:
    """One launch as its transport knows it; ``Launch`` wraps it.

    ``record`` is set for a launch that went as a ring record (errors name it), and
    ``launch_id`` and the timings for one the daemon answered by a call: a ring
    record gets no answer of its own, so those are ``None`` there, not made up.
    """

    __slots__ = (
        "completed",
        "elapsed_seconds",
        "enqueue_seconds",
        "launch_id",
        "record",
        "session_id",
        "waiter",
    )

    def __init__(
        self,
        waiter: Waiter,
        session_id: str,
        completed: bool,
        record: int | None = None,
        *,
        launch_id: str | None = None,
        enqueue_seconds: float | None = None,
        elapsed_seconds: float | None = None,
    ) -> None:
        self.waiter = waiter
        self.session_id = session_id
        self.completed = completed
        self.record = record
        self.launch_id = launch_id
        self.enqueue_seconds = enqueue_seconds
        self.elapsed_seconds = elapsed_seconds

    @property
    def name(self) -> str:
        """How messages name this launch."""
        what = f"ring record {self.record}" if self.record is not None else self.launch_id
        return f"launch {what} of session {self.session_id}"


class Transport(Protocol):
    """How one link's launches and bytes travel; every operation is safe from any thread."""

    @property
    def path(self) -> str:
        """Which way launches go: ``ring``, ``ring-stream``, ``unary``, or ``pending`` (a
        ring not opened yet)."""
        ...

    def launch(self, request: LaunchRequest) -> Ticket:
        """Check and send one launch. A refusal of an earlier launch sent without waiting
        that nothing reported yet raises first, naming it."""
        ...

    def wait(self, request: WaitRequest) -> None:
        """Until what ``request`` names is done; what failed raises."""
        ...

    def forget(self, object_id: str) -> None:
        """A session or buffer id that goes away (released, freed, collected, loaded again,
        lost): drop what is kept for it, here and on the daemon."""
        ...

    def write(self, request: WriteRequest) -> int:
        """Upload; the bytes written."""
        ...

    def read(self, request: ReadRequest) -> np.ndarray[Any, Any]:
        """Download; the bytes, as a flat ``uint8`` array (``request.into``'s where given)."""
        ...

    def copy(self, request: CopyRequest) -> int:
        """A shared-memory copy (a COPY record on a shared ring, in its order with the
        launches, else a ``CopySegment`` call); the bytes copied."""
        ...

    def close(self, drain: float = 0.0) -> None:
        """Stop: launches on their way get up to ``drain`` seconds to reach the daemon."""
        ...

    def abandon(self) -> None:
        """In a forked child: let go of what the parent's process owns, writing nothing."""
        ...


def session_id_on(session: LaunchOwner, link: Any) -> str:
    """The id of a launch's session for a call on ``link`` (loading it there first if need
    be); raises why it cannot launch there."""
    return session._id_on(link)


def ids_of(buffers: Sequence[BufferRef], link: Any, role: str) -> list[str]:
    """The ids of a launch's ``operands`` or ``results`` (``role``) for a call on ``link``;
    anything but a ``Buffer`` or an id is refused, naming its place."""
    ids = []
    for index, buffer in enumerate(buffers):
        if isinstance(buffer, str):
            ids.append(buffer)
            continue
        id_on = getattr(buffer, "_buffer_id_on", None)
        if id_on is None:
            raise _not_a_buffer(buffer, f"{role}[{index}]")
        ids.append(id_on(link))
    return ids


def _not_a_buffer(value: object, where: str) -> InvalidArgument:
    if isinstance(value, np.ndarray):
        why = (
            f"is a numpy array; a launch takes Buffers: upload it with client.buffer(array) "
            f"(or make one with client.empty({value.size}, {str(value.dtype)!r}))"
        )
    else:
        why = f"is a {type(value).__name__}; a launch takes Buffers (or their ids)"
    message = f"{where} {why}"
    return InvalidArgument(
        message, reason="NOT_A_BUFFER", field_violations=[FieldViolation(where, message)]
    )
