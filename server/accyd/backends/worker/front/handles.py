"""The front's halves of a worker's handles, and what the front knows of their completion.

Every handle ``WorkerBackend`` hands out carries an id the front chose; the
worker maps it to its backend's object. Completion knowledge saves round trips:
events on one stream finish in the order they were recorded, so each stream
(``Track``) keeps how many events were recorded on it and up to which one its
work is known to be over. Anything that proves work over (a synchronize, an
``event_done`` answer, a notification) moves that mark; ``event_done`` and
``wait_event_for`` of an event at or below it need no round trip.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from accyd.backends.base import (
    ArtifactRequest,
    CompiledArtifact,
    LaunchRequest,
    ScalarChange,
    Stream,
)
from accyd.backends.worker.channel import Channel
from accyd.backends.worker.protocol import Op
from accyd.errors import LaunchFailed, UnsupportedOperation

__all__ = [
    "EventState",
    "RemoteArtifact",
    "RemotePrepared",
    "Track",
    "launch_fields",
    "stream_id",
]


class Track:
    """One stream's events, as the front counts them (``Stream.native`` of a worker stream)."""

    __slots__ = ("newest", "reached", "recorded", "watching")

    def __init__(self) -> None:
        self.recorded = 0
        """Events recorded on the stream (bumped in send order, under the channel's lock)."""
        self.reached = 0
        """Events known finished: every one up to this count."""
        self.newest: tuple[int, int] = (0, 0)
        """``(event id, count)`` of the newest event recorded on the stream."""
        self.watching = 0
        """The count a notification is registered for and not yet reached (``event_done``
        registers one per stream at a time, for its newest event: it covers the older)."""

    def recorded_event(self, eid: int, seq: int) -> None:
        """Event ``eid`` is the ``seq``-th on the stream."""
        if seq > self.newest[1]:
            self.newest = (eid, seq)

    def advance(self, upto: int) -> None:
        """The work before the ``upto``-th event is over. A race may lose an advance,
        never claim too much: ``reached`` only takes counts proven over."""
        if upto > self.reached:
            self.reached = upto


class EventState:
    """``Event.native`` of a worker event: its stream, that stream's track, its place on it."""

    __slots__ = ("seq", "sid", "track", "waiter")

    def __init__(self, track: Track, seq: int, sid: int | None) -> None:
        self.track = track
        self.seq = seq
        self.sid = sid
        """The id of the stream it was recorded on (``None``: the default stream)."""
        self.waiter: threading.Event | None = None
        """Set once a notification for this event is registered (``wait_event_for``)."""

    def known_done(self) -> bool:
        return self.seq <= self.track.reached


def stream_id(stream: Stream | None) -> int | None:
    return None if stream is None else stream.id


def launch_fields(request: LaunchRequest) -> tuple[Any, ...]:
    """A launch as the protocol's *launch* fields: plain ints, strings and tuples."""
    geometry = request.geometry
    return (
        request.loaded.id,
        tuple([buffer.id for buffer in request.buffers]),
        tuple([(scalar.dtype._value_, scalar.value) for scalar in request.scalars]),
        geometry.grid,
        geometry.block,
        request.shared_memory_bytes,
        request.diagnostic_id,
    )


class RemoteArtifact(CompiledArtifact):
    """A compiled kernel held by the worker; ``image`` is its id there.

    The caller owns it; ``close()`` (idempotent) frees the worker's copy."""

    def __init__(self, request: ArtifactRequest, aid: int, channel: Channel) -> None:
        super().__init__(request, aid)
        self.channel = channel

    def close(self) -> None:
        aid = self.image
        super().close()
        if aid is not None:
            self.channel.post_quietly((Op.CLOSE_ARTIFACT, aid))


class RemotePrepared:
    """A prepared launch held by the worker (a CUDA graph there), replayed by a one-way op.

    Its owner closes it (idempotent) before freeing any buffer it names. A native engine's
    table driver knows it by a weak reference."""

    __slots__ = ("__weakref__", "channel", "pid")

    def __init__(self, channel: Channel, pid: int) -> None:
        self.channel = channel
        self.pid: int | None = pid

    def launch(self, stream: Stream | None, count: int = 1) -> None:
        pid = self.pid
        if pid is None:
            raise LaunchFailed("this prepared launch was closed")
        self.channel.post((Op.REPLAY, pid, None if stream is None else stream.id, count))

    def set_scalars(self, changes: Sequence[ScalarChange]) -> None:
        """Not offered: ``WorkerBackend.prepared_takes_scalars`` is false, so nothing asks."""
        raise UnsupportedOperation("the worker replays prepared launches as they were made")

    def close(self) -> None:
        pid, self.pid = self.pid, None
        if pid is not None:
            self.channel.post_quietly((Op.CLOSE_PREPARED, pid))
