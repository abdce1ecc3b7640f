"""The client's transport seam: how one link's launches and buffer bytes travel.

As in httpx, a connection gets one ``Transport`` and the API objects never ask
which one: ``Session``, ``Buffer`` and ``Launch`` call ``launch``, ``wait``,
``forget``, ``write``, ``read`` and ``close`` on their link's transport and import
no transport module. One transport per link (an attachment to one daemon
instance), chosen once by ``accy._link_transport.open_transport`` from the target
and the environment:

- launches: the shared ring (a Unix socket), the ring over a ``RingStream`` call
  (TCP, or ``ACCY_RING=stream``), or unary ``Launch`` calls (``ACCY_RING=0``, or
  a daemon that hands out no rings: ``--no-rings``). A ring is opened by the
  link's first launch; one the daemon refuses falls back to the next way.
- bytes: memory shared with a local daemon (``ACCY_SHM``, ``Client(shared_memory=)``)
  for large transfers and shared arrays, else streamed ``WriteBuffer`` and
  ``ReadBuffer`` calls. Shared memory falls back to those where the daemon
  shares none or its segments ran out.

Every launch comes back as a ``Ticket``, whichever way it went; ``Launch`` wraps it.

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

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from accy._chunks import Progress
from accy._models import PipelineInfo
from accy.errors import FieldViolation, InvalidArgument

__all__ = [
    "CLOSE_DRAIN_SECONDS",
    "RECORDS_KEPT",
    "BufferRef",
    "ForgetFn",
    "LaunchFn",
    "LaunchOwner",
    "ReadFn",
    "Ticket",
    "Transport",
    "WaitFn",
    "Waiter",
    "WriteFn",
    "ids_of",
]

CLOSE_DRAIN_SECONDS = 10.0
"""How long closing the client waits for the daemon to take the launches sent without
waiting (a ring over a stream: they are in flight on the wire)."""
RECORDS_KEPT = 256
"""Packed records (plans) a ring transport keeps; past this it starts over."""


class Named(Protocol):
    """A buffer as a launch names it: its id for a call on a link (``Buffer.on``)."""

    def on(self, link: Any) -> str: ...


BufferRef = Named | str
"""A launch's operand or result: a ``Buffer``, or a buffer id."""


class LaunchOwner(Protocol):
    """What a transport needs of the session it launches (a ``Session``)."""

    info: PipelineInfo

    @property
    def id(self) -> str:
        """Its id now (for messages)."""
        ...

    def id_on(self, link: Any) -> str:
        """The session's id on ``link``; raises why it cannot launch there."""
        ...


class Waiter(Protocol):
    """The part of a transport that waits for its tickets."""

    def wait(
        self, ticket: Ticket | None, session_id: str | None, timeout: float | None
    ) -> None: ...


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


LaunchFn = Callable[
    [LaunchOwner, Sequence[BufferRef], Sequence[BufferRef], Mapping[str, object], bool, Any],
    Ticket,
]
WaitFn = Callable[[Ticket | None, str | None, float | None], None]
ForgetFn = Callable[[str], None]
WriteFn = Callable[[str, int, memoryview, int, float | None, int, Progress | None], int]
ReadFn = Callable[
    [str, int, int, int, np.ndarray[Any, Any] | None, float | None, int, Progress | None],
    np.ndarray[Any, Any],
]


class Transport(Protocol):
    """How one link's launches and bytes travel; every operation is safe from any thread."""

    @property
    def path(self) -> str:
        """Which way launches go: ``ring``, ``ring-stream``, ``unary``, or ``pending`` (a
        ring not opened yet)."""
        ...

    launch: LaunchFn
    """``launch(session, operands, results, scalars, wait, timeout)``: check and send one
    launch (with ``wait``, return once it finished). A refusal of an earlier launch sent
    without waiting that nothing reported yet raises first, naming it."""

    wait: WaitFn
    """``wait(ticket, session_id, timeout)``: until ``ticket``'s launch finished; without a
    ticket, every launch of ``session_id`` so far; with neither, until the daemon took
    every launch sent (so a call after it is ordered after them). What failed raises."""

    forget: ForgetFn
    """``forget(object_id)``: a session or buffer id that goes away (released, freed,
    collected, loaded again, lost): drop what is kept for it, here and on the daemon."""

    write: WriteFn
    """``write(buffer_id, device, data, offset, timeout, chunk_size, progress)``: upload
    ``data`` at byte ``offset``; the bytes written."""

    read: ReadFn
    """``read(buffer_id, device, offset, size, into, timeout, chunk_size, progress)``: download
    ``size`` bytes from byte ``offset``, into ``into`` (a C-contiguous array of that many
    bytes) where given; the bytes, as a flat ``uint8`` array."""

    def close(self, drain: float = 0.0) -> None:
        """Stop: launches on their way get up to ``drain`` seconds to reach the daemon."""
        ...

    def abandon(self) -> None:
        """In a forked child: let go of what the parent's process owns, writing nothing."""
        ...


def ids_of(buffers: Sequence[BufferRef], link: Any, role: str) -> list[str]:
    """The ids of a launch's ``operands`` or ``results`` (``role``) for a call on ``link``;
    anything but a ``Buffer`` or an id is refused, naming its place."""
    ids = []
    for index, buffer in enumerate(buffers):
        if isinstance(buffer, str):
            ids.append(buffer)
            continue
        on = getattr(buffer, "on", None)
        if on is None:
            raise _not_a_buffer(buffer, f"{role}[{index}]")
        ids.append(on(link))
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
