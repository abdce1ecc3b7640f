"""A ``WorkerBackend``'s streams: streams, events, notifications, waits and copies.

Everything here knows completion through ``accyd.backends.worker.front.handles.Track``: a
round trip that waited for work (a synchronize, a copy on a stream) or a
notification moves its stream's mark, so later ``event_done``/``wait_event_for``
of that work need no round trip. See ``accyd.backends.worker.front.proxy`` for the rules.
"""

from __future__ import annotations

import contextlib
import itertools
import pickle
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from accyd.backends.base import DeviceBuffer, Event, Stream
from accyd.backends.host_streams import call_quietly
from accyd.backends.partitions import PartitionSpec, SmSplit
from accyd.backends.worker.channel import Channel
from accyd.backends.worker.front.handles import EventState, Track, stream_id
from accyd.backends.worker.front.pins import PinnedRanges
from accyd.backends.worker.protocol import ALL_STREAMS, CHUNK_BYTES, Op
from accyd.errors import DeviceFault, LaunchArgumentMismatch, Unavailable

__all__ = ["WorkerStreams"]


class WorkerStreams:
    """The streams a ``WorkerBackend`` made, what its front knows of their work, and the
    events, waits and copies on them, over the backend's channel.

    Streams and events are owned by their callers and freed through
    ``destroy_stream``/``destroy_event`` (one-way; nothing after a fault)."""

    def __init__(self, channel: Channel, ids: itertools.count[int], pins: PinnedRanges) -> None:
        """``ids``: the counter every handle's id comes from; ``pins``: the host memory the
        worker mapped (``pin_host`` adds to it), which copies inside it name."""
        self._channel = channel
        self._ids = ids
        self._pins = pins
        self._lock = threading.Lock()
        self._default = Track()
        self._tracks: dict[int, Track] = {}

    # -- streams and events ----------------------------------------------------------------------

    def _track(self, stream: Stream | None) -> Track:
        if stream is None:
            return self._default
        track = stream.native
        if not isinstance(track, Track):
            raise LaunchArgumentMismatch(f"stream {stream.id} is not a stream of this worker")
        return track

    def synchronize(self, stream: Stream | None = None) -> None:
        if stream is None:
            with self._lock:
                tracks = [self._default, *self._tracks.values()]
            marks = [(track, track.recorded) for track in tracks]
            sid: int | None = ALL_STREAMS
        else:
            track = self._track(stream)
            marks = [(track, track.recorded)]
            sid = stream.id
        self._waited(lambda c: (Op.SYNCHRONIZE, c, sid), marks)

    def _waited(
        self, build: Callable[[int], tuple[Any, ...]], marks: Sequence[tuple[Track, int]], **kw: Any
    ) -> Any:
        """A round trip that waits for work: afterwards (failed or not) that work is over."""
        try:
            result = self._channel.call(build, **kw)
        except (DeviceFault, Unavailable):
            raise
        except Exception:
            for track, upto in marks:
                track.advance(upto)
            raise
        for track, upto in marks:
            track.advance(upto)
        return result

    def create_stream(self, partition: str | None = None, priority: int = 0) -> Stream:
        """A round trip (the worker makes the stream before anything names it)."""
        sid = next(self._ids)
        self._channel.call(lambda c: (Op.CREATE_STREAM, c, sid, partition, priority))
        track = Track()
        with self._lock:
            self._tracks[sid] = track
        return Stream(sid, track, partition)

    def split_sms(self, specs: Sequence[PartitionSpec]) -> SmSplit:
        """A round trip: the worker's backend splits its device."""
        split: SmSplit = self._channel.call(lambda c: (Op.SPLIT_SMS, c, tuple(specs)))
        return split

    def destroy_stream(self, stream: Stream) -> None:
        with self._lock:
            if self._tracks.pop(stream.id, None) is None:
                return
        self._channel.post_quietly((Op.DESTROY_STREAM, stream.id))

    def record_event(self, stream: Stream | None) -> Event:
        """One-way, and the flush: the batch (this launch's ops) goes as one frame."""
        track, sid = self._track(stream), stream_id(stream)
        eid = next(self._ids)
        seq = self._channel.flush((Op.RECORD, eid, sid), track)
        track.recorded_event(eid, seq)
        return Event(eid, EventState(track, seq, sid))

    @staticmethod
    def _state(event: Event) -> EventState:
        state = event.native
        if not isinstance(state, EventState):
            raise LaunchArgumentMismatch(f"event {event.id} is not an event of this worker")
        return state

    def wait_event(self, stream: Stream | None, event: Event) -> None:
        """One-way; nothing at all when the event is known over already."""
        if not self._state(event).known_done():
            self._channel.post((Op.WAIT_EVENT, stream_id(stream), event.id))
        elif self._channel.dead:
            raise self._channel.dead_error()

    def event_done(self, event: Event) -> bool:
        """Answered here, never by a round trip: ``False`` until the front learns the work is
        over. An ask that no registered notification covers registers one for the stream's
        newest event (one at a time per stream: it covers every older one), so a poll (a
        session's reap, a ring's settle) sees ``True`` soon after the device finished,
        without a round trip or a notification per launch."""
        channel = self._channel
        if channel.dead:
            raise channel.dead_error()
        state = self._state(event)
        if state.known_done():
            return True
        track = state.track
        if track.watching < state.seq:  # nothing registered covers it: one for the newest
            eid, seq = track.newest
            if seq < state.seq:
                eid, seq = event.id, state.seq
            track.watching = seq
            try:
                self._notify_event(eid, EventState(track, seq, state.sid), lambda: None)
            except (DeviceFault, Unavailable):
                if channel.dead:
                    raise channel.dead_error() from None
                raise
        return state.known_done()

    def wait_event_for(self, event: Event, seconds: float) -> bool:
        """A notification registered once per event, waited for here: True at once when the
        work is known over, the event failed, or the worker is lost."""
        state = self._state(event)
        if self._channel.dead or state.known_done():
            return True
        try:
            waiter = self._watched(event, state)
        except (DeviceFault, Unavailable):
            return True
        return waiter.wait(seconds) or state.known_done() or self._channel.dead

    def _watched(self, event: Event, state: EventState) -> threading.Event:
        """The event's waiter, set once its work is over: registered with the worker at the
        first call for this event, shared by every later one."""
        waiter = state.waiter
        if waiter is not None:
            return waiter
        with self._lock:
            waiter = state.waiter
            fresh = waiter is None
            if waiter is None:
                waiter = state.waiter = threading.Event()
        if fresh:
            self._notify_event(event.id, state, waiter.set)
        return waiter

    def _notify_event(self, eid: int, state: EventState, callback: Callable[[], None]) -> None:
        """Register ``callback`` for the event's work, on the stream it was recorded on."""
        track, seq = state.track, state.seq

        def reached() -> None:
            track.advance(seq)
            callback()

        nid = self._channel.watch(reached)
        self._channel.flush((Op.NOTIFY_EVENT, nid, eid, state.sid))

    def notify(self, stream: Stream | None, callback: Callable[[], None]) -> None:
        """Flushes; ``callback`` runs on the reader thread once the stream's work so far is over."""
        track = self._track(stream)
        upto = track.recorded

        def reached() -> None:
            track.advance(upto)
            callback()

        nid = self._channel.watch(reached)
        self._channel.flush((Op.NOTIFY, nid, stream_id(stream)))

    def notify_event(
        self, event: Event, stream: Stream | None, callback: Callable[[], None]
    ) -> None:
        """At once (on this thread) when the event is known over; else on the reader thread
        once it is (``stream`` is ignored: the event names the stream it was recorded on)."""
        state = self._state(event)
        channel = self._channel
        if channel.dead:
            raise channel.dead_error()
        if state.known_done():
            call_quietly(callback)
            return
        self._notify_event(event.id, state, callback)

    def drop_queued(self, stream: Stream) -> None:
        """A round trip (rare: at a detach), so kernels not started by its return are dropped,
        as in-process. Nothing after a fault: nothing is queued in a dead worker."""
        if not self._channel.dead:
            with contextlib.suppress(DeviceFault, Unavailable):
                self._channel.call(lambda c: (Op.DROP_QUEUED, c, stream.id))

    def synchronize_event(self, event: Event) -> None:
        state = self._state(event)
        self._waited(lambda c: (Op.SYNC_EVENT, c, event.id), [(state.track, state.seq)])

    def destroy_event(self, event: Event) -> None:
        self._channel.post_quietly((Op.DESTROY_EVENT, event.id))

    # -- copies ----------------------------------------------------------------------------------

    def write(
        self, buffer: DeviceBuffer, offset: int, data: bytes | memoryview, stream: Stream | None
    ) -> None:
        """A round trip carrying ``data`` (in 1 MiB frames), or naming it when it lies in memory
        the worker mapped (``pin_host`` with a descriptor); done on return."""
        view = memoryview(data)
        if not view.c_contiguous:
            view = memoryview(view.tobytes())
        view = view.cast("B") if view.ndim != 1 or view.format != "B" else view
        total = view.nbytes
        track = self._track(stream)
        sid, bid = stream_id(stream), buffer.id
        found = self._pins.find(view) if self._pins.ranges and type(data) is not bytes else None
        if found is not None:
            hid, start = found
            self._waited(
                lambda c: (Op.WRITE_SHARED, c, bid, offset, sid, hid, start, total),
                [(track, track.recorded)],
            )
            return
        first = pickle.PickleBuffer(view[:CHUNK_BYTES])

        def more(c: int) -> Iterator[tuple[Any, ...]]:
            for start in range(CHUNK_BYTES, total, CHUNK_BYTES):
                yield (Op.WRITE_MORE, c, pickle.PickleBuffer(view[start : start + CHUNK_BYTES]))

        self._waited(
            lambda c: (Op.WRITE, c, bid, offset, total, sid, first),
            [(track, track.recorded)],
            more=more,
        )

    def read(self, buffer: DeviceBuffer, offset: int, size: int, stream: Stream | None) -> bytes:
        """A round trip; the bytes come in 1 MiB frames."""
        chunks: list[bytes] = []
        self._read(buffer, offset, size, stream, chunks.append)
        if len(chunks) == 1 and type(chunks[0]) is bytes:
            return chunks[0]
        return b"".join(chunks)  # frames past 256 KiB arrive as views of their own buffer

    def read_into(
        self, buffer: DeviceBuffer, offset: int, out: bytearray | memoryview, stream: Stream | None
    ) -> None:
        """A round trip; each frame's bytes are copied into ``out`` on the reader thread, or
        none at all when ``out`` lies in memory the worker mapped (``pin_host`` with a
        descriptor): the worker copies into its mapping of the same pages."""
        view = memoryview(out)
        if view.readonly or not view.c_contiguous:
            raise LaunchArgumentMismatch("read_into needs a writable, C-contiguous buffer")
        target = view.cast("B") if view.ndim != 1 or view.format != "B" else view
        found = self._pins.find(target) if self._pins.ranges else None
        if found is not None:
            track = self._track(stream)
            sid, bid, (hid, start), size = stream_id(stream), buffer.id, found, target.nbytes
            self._waited(
                lambda c: (Op.READ_SHARED, c, bid, offset, sid, hid, start, size),
                [(track, track.recorded)],
            )
            return
        filled = [0]

        def sink(chunk: bytes) -> None:
            start = filled[0]
            target[start : start + len(chunk)] = chunk
            filled[0] = start + len(chunk)

        self._read(buffer, offset, target.nbytes, stream, sink)

    def _read(
        self,
        buffer: DeviceBuffer,
        offset: int,
        size: int,
        stream: Stream | None,
        sink: Callable[[bytes], None],
    ) -> None:
        track = self._track(stream)
        sid, bid = stream_id(stream), buffer.id
        self._waited(
            lambda c: (Op.READ, c, bid, offset, size, sid), [(track, track.recorded)], sink=sink
        )
