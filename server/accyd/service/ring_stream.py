"""RingStream: a client's ring whose records come as messages, taken on the event loop.

A client that cannot map the daemon's memory (another host, a TCP target)
sends the same-host ring's records in frames, and gets the ring's counters
back as messages. The records go into a ring the daemon keeps for itself
(``RingMemory(shared=False)``) and are taken by the same ``ServerRing`` the
submitter runs for shared rings: every check, bound launches replayed in runs,
refusals as error entries naming the record. So a remote launch costs a
record's bytes on the wire and a bound replay in the daemon, not a
``LaunchRequest`` and a full ``Daemon.launch`` each.

The ring is taken here, on the event loop, as each frame arrives: a waited
record costs no thread hop. A frame holding a record its client waits for
(``NOTIFY``) is spun on for the launch spin (as a waited ``Launch`` is); one
still running, and launches in flight, are finished by the device's
notification (``ServerRing.notify_settled``, one asked at a time), with a slow
poll behind it for a lost device. Each message out carries the counters as
they are then, so one answers many records.

The ring lives as long as its stream: the stream's end closes it (its marks
let go), and a client that detached ends the stream at its next frame.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import structlog

from accy.protocol import ring as layout
from accy.protocol.launch.v1 import launch_pb2 as pb
from accyd.core.daemon import Daemon
from accyd.core.ids import new_id
from accyd.errors import InvalidRequest, QuotaExceeded, Unavailable
from accyd.ring.door import ring_slots
from accyd.ring.memory import RingMemory
from accyd.ring.needs import RingObserver
from accyd.ring.ring import ServerRing
from accyd.service.calls import Context
from accyd.service.launches import until_stopped

__all__ = ["POLL_SECONDS", "STREAMS_PER_CLIENT", "RingStreams"]

log = structlog.get_logger("accyd.ring")

POLL_SECONDS = 0.05
"""With launches in flight, how often they are looked at besides the device's notification."""

STREAMS_PER_CLIENT = 8
"""Ring streams one client may hold open at once (each is up to a MiB of the daemon's memory)."""

_FLAGS = 10
"""A record's flags' low byte."""


class RingStreams:
    """Serves ``RingStream`` for the service: one ``_StreamRing`` per open stream."""

    def __init__(
        self,
        daemon: Daemon,
        *,
        spin_seconds: float,
        batch: int = 64,
        observer: RingObserver | None = None,
    ) -> None:
        self.daemon = daemon
        self.observer = observer
        self.spin_seconds = spin_seconds
        """How long a frame with a waited record is spun on (the service's launch spin)."""
        self.batch = batch
        self._open: dict[str, int] = {}
        """Open streams per client."""

    async def serve(
        self, client_id: str, frames: AsyncIterator[pb.RingFrame], context: Context
    ) -> None:
        """Open the ring the first frame asks for, then take each frame's records until the
        client stops sending and its records are done."""
        frames = until_stopped(frames, self.daemon)
        try:
            hello = await anext(frames)
        except StopAsyncIteration:
            return
        if hello.records:
            raise InvalidRequest(
                "the first frame opens the ring (slots) and carries no records", field="records"
            )
        self.daemon.client(client_id)  # attached, or CLIENT_UNKNOWN
        slots = ring_slots(hello.slots)
        held = self._open.get(client_id, 0)
        if held >= STREAMS_PER_CLIENT:
            raise QuotaExceeded(
                f"client {client_id} has {held} ring streams open, the most one client may "
                "have: launch on those (one per connection is enough)",
                quota="ring_streams_per_client",
            )
        self._open[client_id] = held + 1
        ring = _StreamRing(self, client_id, slots, context)
        try:
            await context.write(pb.RingState(slots=slots))
            async for frame in frames:
                self.daemon.client(client_id)  # a detached client's stream ends here
                await ring.take(frame)
            await ring.drain()
        finally:
            ring.close()
            left = self._open.pop(client_id) - 1
            if left:
                self._open[client_id] = left


class _StreamRing:
    """One stream's ring: its memory and ``ServerRing``, owned here and closed with the
    stream; lives on the event loop (the device's notifications come back to it)."""

    def __init__(self, streams: RingStreams, client_id: str, slots: int, context: Context) -> None:
        self._streams = streams
        self._memory = RingMemory(slots, shared=False)
        self._ring = ServerRing(
            new_id("ring"), client_id, self._memory, streams.daemon, observer=streams.observer
        )
        self._context = context
        self._loop = asyncio.get_running_loop()
        self._head = 0
        self._sent = (0, 0, 0)
        """The tail, done and errors the client was last told."""
        self._armed = 0
        """Device notifications asked for and not come yet."""
        self._poll: asyncio.TimerHandle | None = None
        self._writing = False
        self._again = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._closed = False

    async def take(self, frame: pb.RingFrame) -> None:
        """Check the frame's framing, take its records through the ring, send what moved."""
        records = frame.records
        count, odd = divmod(len(records), layout.SLOT_SIZE)
        if odd or frame.first != self._head or count > self._memory.slot_count:
            raise InvalidRequest(
                f"a frame carries whole records from seq {self._head} on, at most "
                f"{self._memory.slot_count} of them ({len(records)} bytes from seq "
                f"{frame.first} is not that)",
                field="records",
            )
        if not count:
            return
        memory, ring = self._memory, self._ring
        memory.write(self._head, records)
        self._head += count
        memory.set_u64(layout.HEAD, self._head)
        batch = self._streams.batch
        while ring.pending():
            ring.take(batch)
        if ring.broken:  # a fault that stops the daemon: say what the entries say, then end
            await self._flush()
            raise Unavailable("the daemon closed this ring: it is stopping")
        waited = any(flags & layout.NOTIFY for flags in records[_FLAGS :: layout.SLOT_SIZE])
        ring.settle_for(self._streams.spin_seconds if waited else 0.0)
        self._arm()
        await self._flush()

    async def drain(self) -> None:
        """After the client's last frame: wait until its records are done, and say so."""
        while self._ring.in_flight:
            self._idle.clear()
            self._arm()
            await self._idle.wait()
        await self._flush()

    # Completions -----------------------------------------------------------------------

    def _arm(self) -> None:
        """Ask to hear of the newest batch's end, unless a notification is coming already."""
        ring = self._ring
        if not ring.in_flight:
            self._idle.set()
            return
        if self._armed == 0:
            self._armed = ring.notify_settled(self._notified)
        if self._poll is None:
            self._poll = self._loop.call_later(POLL_SECONDS, self._polled)

    def _notified(self) -> None:
        """From the device's thread: a batch is over."""
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody to tell
            self._loop.call_soon_threadsafe(self._settled, True)

    def _polled(self) -> None:
        self._poll = None
        self._settled(False)

    def _settled(self, notified: bool) -> None:
        if self._closed:
            return
        if notified:
            self._armed = max(self._armed - 1, 0)
        try:
            self._ring.settle()
        except Exception:
            log.exception("ring stream failed to settle", ring_id=self._ring.id)
            return
        self._arm()
        if not self._writing:
            task = self._loop.create_task(self._flush())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self._again = True

    # Answers ---------------------------------------------------------------------------

    async def _flush(self) -> None:
        """Send the counters if they moved since the last message (one writer at a time)."""
        if self._writing:
            self._again = True
            return
        self._writing = True
        try:
            while True:
                self._again = False
                state = self._state()
                if state is not None:
                    await self._context.write(state)
                if not self._again:
                    return
        finally:
            self._writing = False

    def _state(self) -> pb.RingState | None:
        memory = self._memory
        now = (memory.u64(layout.TAIL), memory.u64(layout.DONE), memory.u64(layout.ERRORS))
        if now == self._sent:
            return None
        told = self._sent[2]
        self._sent = now
        tail, done, errors = now
        state = pb.RingState(tail=tail, done=done, errors=errors)
        if errors != told:
            state.first_error, state.entries = memory.entries(told, errors)
        return state

    def close(self) -> None:
        """Let the ring's marks go and stop listening; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._poll is not None:
            self._poll.cancel()
        for task in self._tasks:
            task.cancel()
        self._ring.close()
