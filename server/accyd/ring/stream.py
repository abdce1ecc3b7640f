"""The ring side of a ``RingStream`` call: a client's ring whose records come as frames.

A client that cannot map the daemon's memory (another host, a TCP target) sends the
same-host ring's records in frames, and gets the ring's counters back as messages. The
records go into a ring the daemon keeps for itself (``RingMemory(shared=False)``),
which the same engine takes as it takes shared rings: tickets launched natively, every
other record decided by its ``ServerRing`` (every check, refusals as error entries
naming the record). Nothing a frame carries is checked on the event loop: the loop
copies its records in (at most a ring's worth, bounded) and kicks the engine.

The engine writes the ring's ``complete`` eventfd whenever its tail or done moves (and
the slow path, when it writes an entry); the loop reads it and sends the counters as
they are then, so one message answers many records. The gRPC door
(``accyd.doors.grpc.ring_stream``) wires the call to a ``StreamRing``: frames in, the
``RingCounters`` it is handed out as messages.

The ring lives as long as its stream: the stream's end removes it from the engine and
closes it; a client that detached ends the stream at its next frame. A client that
went (its call cancelled) ends it at once: the ring is abandoned, and the engine
decides none of its records left (``ServerRing.abandon``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from accy.protocol import ring as layout
from accyd.clipping import clip
from accyd.core.ids import new_id
from accyd.core.interface import Core
from accyd.errors import InvalidRequest, QuotaExceeded
from accyd.ring.door import RingTaker, ring_slots
from accyd.ring.memory import RingMemory
from accyd.ring.observer import RingObserver
from accyd.ring.ring import ServerRing
from accyd.scheduling import DeviceWork

__all__ = ["STREAMS_PER_CLIENT", "RingCounters", "StreamRing", "StreamRings"]

log = structlog.get_logger("accyd.ring")

_FLAGS = 10
"""A record's flags' low byte."""

STREAMS_PER_CLIENT = 8
"""Ring streams one client may hold open at once (each is up to a MiB of the daemon's memory)."""


@dataclass(frozen=True, slots=True)
class RingCounters:
    """What a stream's client is told: the ring's counters, and the error entries written
    since it was last told (``entries`` from index ``first_error`` on; none: empty)."""

    tail: int
    done: int
    errors: int
    first_error: int = 0
    entries: bytes = b""


Send = Callable[[RingCounters], Awaitable[None]]
"""Sends the counters to the stream's client (one at a time)."""


class StreamRings:
    """The rings over streams of one server: their engine, and how many each client holds."""

    def __init__(
        self,
        daemon: Core,
        engine: RingTaker,
        *,
        work: DeviceWork,
        spin_seconds: float = 0.0,
        observer: RingObserver | None = None,
    ) -> None:
        self.daemon = daemon
        self.engine = engine
        self.spin_seconds = spin_seconds
        """How long a frame with a record its client waits for is spun on, on the loop (the
        service's launch spin): its answer then goes out without the engine's wake."""
        self.observer = observer
        self.work = work
        self._open: dict[str, int] = {}
        """Open streams per client."""

    def open(self, client_id: str, slots: int, send: Send) -> StreamRing:
        """The ring a stream's first frame asks for (``slots``), answered through ``send``;
        its ``close`` lets it go. Raises if the client is unknown or holds its most."""
        self.daemon.client(client_id)  # attached, or CLIENT_UNKNOWN
        slots = ring_slots(slots)
        held = self._open.get(client_id, 0)
        if held >= STREAMS_PER_CLIENT:
            raise QuotaExceeded(
                f"client {client_id} has {held} ring streams open, the most one client may "
                "have: launch on those (one per connection is enough)",
                quota="ring_streams_per_client",
            )
        self._open[client_id] = held + 1
        try:
            return StreamRing(self, client_id, slots, send)
        except BaseException:
            self.release(client_id)
            raise

    def release(self, client_id: str) -> None:
        """One of the client's streams ended (its ring's ``close``)."""
        left = self._open.pop(client_id) - 1
        if left:
            self._open[client_id] = left


class StreamRing:
    """One stream's ring: its memory and ``ServerRing``, taken by the engine, answered from
    the event loop (the engine's wakes come back to it through ``complete``)."""

    def __init__(self, streams: StreamRings, client_id: str, slots: int, send: Send) -> None:
        self._streams = streams
        self._client_id = client_id
        self._memory = RingMemory(slots, shared=False)
        self._ring = ServerRing(
            new_id("ring"),
            client_id,
            self._memory,
            streams.daemon,
            streams.work,
            observer=streams.observer,
        )
        self._engine = streams.engine
        self._send = send
        self._loop = asyncio.get_running_loop()
        self._head = 0
        self._sent = (0, 0, 0)
        """The tail, done and errors the client was last told."""
        self._writing = asyncio.Lock()
        self._flushing: asyncio.Task[None] | None = None
        self._again = False
        """The ring moved since the flush under way read its counters."""
        self._moved = asyncio.Event()
        self._closed = False
        self._engine.add(self._ring, notify_always=True)
        self._loop.add_reader(self._memory.complete_fd, self._on_moved)

    @property
    def slots(self) -> int:
        return self._memory.slot_count

    @property
    def broken(self) -> bool:
        return self._ring.broken

    def take(self, first: int, records: bytes) -> bool:
        """Check a frame's framing (its records, from seq ``first`` on), copy its records in,
        kick the engine; whether the client waits for one of them (``NOTIFY``)."""
        count, odd = divmod(len(records), layout.SLOT_SIZE)
        memory = self._memory
        room = memory.slot_count - (self._head - memory.u64(layout.TAIL))
        if odd or first != self._head or count > room:
            raise InvalidRequest(
                f"a frame carries whole records from seq {self._head} on, at most {room} of "
                f"them now (its window: records not yet taken); {len(records)} bytes from "
                f"seq {first} is not that",
                field="records",
            )
        if not count:
            return False
        memory.write(self._head, records)
        self._head += count
        memory.set_u64(layout.HEAD, self._head)
        memory.kick()
        return any(flags & layout.NOTIFY for flags in records[_FLAGS :: layout.SLOT_SIZE])

    async def spin(self, seconds: float) -> None:
        """Look for the records' end for at most ``seconds`` (a bounded slice of the loop),
        and answer at once if it came."""
        memory, head = self._memory, self._head
        until = time.perf_counter() + seconds
        while memory.u64(layout.DONE) < head and time.perf_counter() < until:
            pass
        if memory.u64(layout.DONE) >= head:
            await self.flush()

    async def drain(self) -> None:
        """After the client's last frame: wait until its records are done, and say so."""
        memory, ring = self._memory, self._ring
        while memory.u64(layout.DONE) < self._head and not (ring.broken or ring.abandoned):
            self._moved.clear()
            if memory.u64(layout.DONE) >= self._head:
                break
            await self._moved.wait()
        await self.flush()

    def abandon(self) -> None:
        """The client went: its records not yet decided are dropped, and ``drain`` ends."""
        self._ring.abandon()
        self._moved.set()

    # Answers ---------------------------------------------------------------------------

    def _on_moved(self) -> None:
        """The engine (or the slow path's entry) moved the ring: tell the client."""
        self._memory.drain_complete()
        self._moved.set()
        self._again = True
        if self._closed or self._flushing is not None:
            return  # the flush under way reads the counters again before it ends
        self._flushing = self._loop.create_task(self._flush_soon())

    async def _flush_soon(self) -> None:
        """Answer the engine's wake (a task of its own: its error is logged here, since
        nobody awaits it; the stream itself ends on its own as its call does)."""
        try:
            while self._again:
                self._again = False
                await self.flush()
        except Exception as error:
            log.info("ring stream state not sent: its call is over", error=clip(repr(error)))
        finally:
            self._flushing = None

    async def flush(self) -> None:
        """Send the counters as they are now, if they moved since the last message (one
        message at a time: the counters are read once the one before went out)."""
        async with self._writing:
            state = self._state()
            if state is not None:
                await self._send(state)

    def _state(self) -> RingCounters | None:
        memory = self._memory
        now = (memory.u64(layout.TAIL), memory.u64(layout.DONE), memory.u64(layout.ERRORS))
        if now == self._sent:
            return None
        told = self._sent[2]
        self._sent = now
        tail, done, errors = now
        if errors == told:
            return RingCounters(tail, done, errors)
        first_error, entries = memory.entries(told, errors)
        return RingCounters(tail, done, errors, first_error, entries)

    async def close(self) -> None:
        """Stop listening, have the engine let the ring go (it closes it), and count the
        client's stream as ended; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._ring.abandon()  # at once, on the loop: the engine lets it go on a thread
            self._moved.set()
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(self._memory.complete_fd)
            if self._flushing is not None:
                self._flushing.cancel()
            await asyncio.to_thread(self._engine.remove, self._ring)
        finally:
            self._streams.release(self._client_id)
