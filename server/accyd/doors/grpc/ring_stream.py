"""RingStream's wiring: frames in to the stream's ring (``accyd.ring.stream``), its counters out.

The ring side (its memory, engine, answers and bounds) lives in the ring package; this
door reads the call's frames (its first opens the ring), hands each frame's records to
the ring, and writes the ring's counters back as ``RingState`` messages.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from accy.protocol.launch.v1 import launch_pb2 as pb
from accyd.doors.grpc.calls import Context
from accyd.doors.grpc.ending import until_ended
from accyd.doors.grpc.launches import until_stopped
from accyd.errors import InvalidRequest, Unavailable
from accyd.ring.stream import RingCounters, StreamRings

__all__ = ["RingStreams"]


class RingStreams:
    """Serves ``RingStream`` for the service: one ``StreamRing`` per open stream."""

    def __init__(self, rings: StreamRings) -> None:
        self.rings = rings

    async def serve(
        self,
        client_id: str,
        frames: AsyncIterator[pb.RingFrame],
        context: Context,
        gone: asyncio.Event,
    ) -> None:
        """Open the ring the first frame asks for, then take each frame's records until the
        client stops sending and its records are done; or, once ``gone`` is set (the client
        went), at once: the records not yet decided are dropped."""
        daemon, spin = self.rings.daemon, self.rings.spin_seconds
        frames = until_ended(until_stopped(frames, daemon), gone)
        try:
            hello = await anext(frames)
        except StopAsyncIteration:
            return
        if hello.records:
            raise InvalidRequest(
                "the first frame opens the ring (slots) and carries no records", field="records"
            )

        async def send(counters: RingCounters) -> None:
            await context.write(
                pb.RingState(
                    tail=counters.tail,
                    done=counters.done,
                    errors=counters.errors,
                    first_error=counters.first_error,
                    entries=counters.entries,
                )
            )

        ring = self.rings.open(client_id, hello.slots, send)
        leaving = asyncio.ensure_future(gone.wait())
        # The client went: its records not yet decided are dropped at once. Cancelled (the
        # stream's own end, below): nothing to abandon, its records were drained.
        leaving.add_done_callback(lambda went: None if went.cancelled() else ring.abandon())
        try:
            await context.write(pb.RingState(slots=ring.slots))
            async for frame in frames:
                daemon.client(client_id)  # a detached client's stream ends here
                if ring.take(frame.first, frame.records) and spin:
                    await ring.spin(spin)
                if ring.broken:  # a fault that stops the daemon: say what the entries say
                    await ring.flush()
                    raise Unavailable("the daemon closed this ring: it is stopping")
            await ring.drain()
        finally:
            leaving.cancel()
            await ring.close()
