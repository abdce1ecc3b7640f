"""Same-host launches of ``accy.aio`` through the daemon's ring, awaited on the event loop.

The ring is the blocking client's (``accy._ring_path.RingLaunches`` over
``accy._ring.Ring``): records are bound, packed and checked by the same code, and
what the daemon refused is raised with the same words. Only waiting differs: a
wait, instead of spinning and sleeping in ``poll``, awaits the ring's ``complete``
eventfd, which the loop watches (``loop.add_reader``) while any wait sleeps, so
many waits take no thread and a cancelled one leaves nothing behind. A record is
only written once the ring has room for it and its binds, so writing never blocks.

A ring is opened by a link's first launch, on a Unix socket unless ``ACCY_RING`` is
``0`` or ``stream`` (a ring over a stream is not offered here: those launches are
calls); one the daemon refuses leaves the link's launches to unary calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from typing import Any, cast

from accy._ring import Ring, RingClosed
from accy._ring_path import RING_WAIT_CAP, RingLaunches
from accy._seam import LaunchRequest, Ticket, WaitRequest
from accy._target import unix_socket_of
from accy.aio._link import AioLink
from accy.errors import AccyError, DeadlineExceeded
from accy.protocol import ring as layout
from accy.protocol.launch.v1 import launch_pb2 as pb

__all__ = ["AioRing", "ring_of"]

LOOK_EVERY = 0.05
"""A sleeping wait looks at the ring's state (closed, the link lost) at least this often."""
ROOM = layout.MAX_BUFFERS + 2
"""Slots free before a launch is written: the record, the binds it may need, an unbind."""


class AioRing:
    """One link's ring, written by the blocking client's ``RingLaunches`` and awaited here."""

    def __init__(self, link: AioLink, ring: Ring) -> None:
        # The link gives what RingLaunches asks of a connection and of a link (timeouts,
        # judging an error, why it was lost or closed).
        self.launches = RingLaunches(cast(Any, link), cast(Any, link), ring, None)
        self.ring = ring
        self._link = link
        self._loop = asyncio.get_running_loop()
        self._sleepers = 0
        self._wake = asyncio.Event()
        ring.abandoned = lambda: link.lost is not None or link.closed

    async def launch(self, request: LaunchRequest) -> Ticket:
        """Write one launch record (once there is room) without waiting for it."""
        ring, left = self.ring, self._timeout(request.timeout)
        most = ring.slots - min(ROOM, ring.slots // 2)  # records not done it may hold first
        if ring.head - ring.done > most:
            room = await self._until(lambda: ring.head - ring.done <= most, left)
            if not room:  # closed: the launch below says so, as the blocking client does
                left = 0.0
        return self.launches.launch(request._replace(wait=False, timeout=left))

    async def wait(self, ticket: Ticket | None, session_id: str | None, timeout: Any) -> None:
        """Until ``ticket``'s record (else every record so far) is done; raise what failed."""
        ring, left = self.ring, self._timeout(timeout)
        seq = ticket.record if ticket is not None and ticket.record is not None else ring.head - 1
        if await self._until(lambda: ring.done > seq, left):
            left = 0.0  # done: the blocking wait returns at once, raising what the daemon refused
        self.launches.wait(WaitRequest(ticket, session_id, left))

    async def settle(self) -> None:
        """Before a call: the daemon took every record written, so the call is ordered after."""
        ring = self.ring
        head = ring.head
        with contextlib.suppress(DeadlineExceeded):
            await self._until(lambda: ring.taken >= head, 10.0)
        with contextlib.suppress(AccyError):
            self.launches.wait(WaitRequest(None, None, 0.0))  # writes the unbinds waiting

    def forget(self, object_id: str) -> None:
        self.launches.forget(object_id)

    def close(self) -> None:
        if self._sleepers:
            self._loop.remove_reader(self.ring.complete_fd)
            self._sleepers = 0
        self.launches.close()

    def _timeout(self, timeout: Any) -> float:
        left = self._link.timeout_of(timeout)
        return RING_WAIT_CAP if left is None else float(left)

    async def _until(self, ready: Callable[[], bool], timeout: float) -> bool:
        """Await ``ready()``: true once it is, false if the ring closed or the link went
        first; ``DeadlineExceeded`` past ``timeout`` seconds."""
        if ready():
            return True
        loop, link, ring = self._loop, self._link, self.ring
        deadline = loop.time() + timeout
        self._sleep()
        try:
            while not ready():
                if ring.closed_by_daemon or link.lost is not None or link.closed:
                    return False
                left = deadline - loop.time()
                if left <= 0:
                    raise DeadlineExceeded(
                        f"the daemon did not get through the ring within {timeout:g} s"
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), min(left, LOOK_EVERY))
        finally:
            self._unsleep()
        return True

    def _sleep(self) -> None:
        self._sleepers += 1
        if self._sleepers == 1:
            self.ring.sleeping(True)
            self._loop.add_reader(self.ring.complete_fd, self._woken)

    def _unsleep(self) -> None:
        if self._sleepers == 0:  # closed meanwhile
            return
        self._sleepers -= 1
        if self._sleepers == 0:
            self.ring.sleeping(False)
            self._loop.remove_reader(self.ring.complete_fd)

    def _woken(self) -> None:
        """``complete`` is readable: read it and wake every sleeping wait to look again."""
        self.ring.woken()
        woken, self._wake = self._wake, asyncio.Event()
        woken.set()


def ring_wanted(target: str) -> bool:
    """Whether launches to ``target`` go through a ring: a Unix socket, ``ACCY_RING`` not off."""
    return unix_socket_of(target) is not None and os.environ.get(layout.RING_ENV, "1") not in (
        "0",
        "stream",
    )


async def ring_of(link: AioLink) -> AioRing | None:
    """The link's ring, opened at its first launch; ``None``: its launches are calls."""
    if not link.ring_tried:
        async with link.ring_lock:
            if not link.ring_tried:
                link.ring = await _open(link) if ring_wanted(link.target) else None
                link.ring_tried = True
    ring = link.ring
    return ring if isinstance(ring, AioRing) else None


async def _open(link: AioLink) -> AioRing | None:
    """The ring the daemon offers the link (taken from its handoff socket); ``None`` where it
    offers none."""
    socket_path = unix_socket_of(link.target)
    assert socket_path is not None
    try:
        offer = await link.call(link.stub.OpenRing, pb.OpenRingRequest())
        handoff = socket_path.with_name(offer.handoff_name)
        taking = asyncio.ensure_future(
            asyncio.to_thread(Ring.connect, handoff, offer.ring_id, offer.ticket)
        )
        try:
            ring = await asyncio.shield(taking)
        except asyncio.CancelledError:  # the ring still comes: close it then, not leak it
            taking.add_done_callback(_close_taken)
            raise
    except (AccyError, OSError, RingClosed):
        return None
    if link.closed:
        ring.close()
        return None
    return AioRing(link, ring)


def _close_taken(taking: asyncio.Future[Ring]) -> None:
    if not taking.cancelled() and taking.exception() is None:
        taking.result().close()
