"""Ending a client's long-lived request streams when it detaches, without cancelling them.

A RingStream lasts as long as its client: an idle one would hold the drain for
the whole grace. Cancelling its handler would end it, but a cancel that lands
while the stream cleans up (its ring let go by the engine, off the loop) cuts
that short and leaks the ring. So a detach ends the stream's *requests*
instead: ``until_ended`` yields the client's frames until the client's end is
set, then stops, and the stream finishes as if its client had stopped
sending: its records drained, its ring closed, nothing cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TypeVar

__all__ = ["StreamEnds", "until_ended"]

_T = TypeVar("_T")


class StreamEnds:
    """One event per client with streams open: set when the client detaches."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}
        self._users: dict[str, int] = {}

    def take(self, client_id: str) -> asyncio.Event:
        """The client's end, for one more stream (``give_back`` when that stream is over)."""
        event = self._events.get(client_id)
        if event is None:
            event = self._events[client_id] = asyncio.Event()
        self._users[client_id] = self._users.get(client_id, 0) + 1
        return event

    def give_back(self, client_id: str) -> None:
        left = self._users.get(client_id, 1) - 1
        if left > 0:
            self._users[client_id] = left
        else:
            self._users.pop(client_id, None)
            self._events.pop(client_id, None)

    def end(self, client_id: str) -> None:
        """The client detached: its streams stop taking requests."""
        event = self._events.get(client_id)
        if event is not None:
            event.set()


async def until_ended(requests: AsyncIterator[_T], ended: asyncio.Event) -> AsyncIterator[_T]:
    """``requests`` until they end or ``ended`` is set (a read pending then is let go)."""
    iterator = aiter(requests)
    waiting = asyncio.ensure_future(ended.wait())
    reading: asyncio.Future[_T] | None = None
    try:
        while not ended.is_set():
            reading = asyncio.ensure_future(anext(iterator))
            done, _ = await asyncio.wait({reading, waiting}, return_when=asyncio.FIRST_COMPLETED)
            if reading not in done:
                reading.cancel()
                with contextlib.suppress(BaseException):
                    await reading
                return
            try:
                request = reading.result()
            except StopAsyncIteration:
                return
            yield request
    finally:
        waiting.cancel()
        if reading is not None:  # a read under way as this was closed: its end is nobody's
            reading.cancel()
            reading.add_done_callback(_settled)


def _settled(reading: asyncio.Future[_T]) -> None:
    """Take a let-go read's error (the stream's end), so asyncio reports none."""
    if not reading.cancelled():
        reading.exception()
