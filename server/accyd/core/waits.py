"""Waiting for device work without holding a thread: completions reach the event loop.

A wait is split in two: what to wait for (retained marks) and what to do once
their work is over (``Deferred.then``: frees, reaps, error reports, all quick by
then). A thread runs both in a row (``finish``, blocking); the event loop awaits
the marks through the backend's notifications (``settle``) and then runs the
rest, so no thread is parked while the device works.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from accyd.core.marks import Mark
from accyd.errors import AccyError

__all__ = ["POLL_FIRST_SECONDS", "POLL_MOST_SECONDS", "Deferred", "until_done"]

POLL_FIRST_SECONDS = 0.05
"""A mark is also polled, from this period up (doubling) to ``POLL_MOST_SECONDS``: a
lost device may never deliver its notifications."""
POLL_MOST_SECONDS = 1.0


@dataclass(slots=True)
class Deferred:
    """Work that may run once ``marks`` are done; ``then`` owns (and releases) the marks."""

    marks: Sequence[Mark]
    then: Callable[[], None]


class _Wake:
    """One future at a time, resolved from any thread by the backend's notification."""

    __slots__ = ("future", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()

    def from_thread(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            self.loop.call_soon_threadsafe(self.set)

    def set(self) -> None:
        if not self.future.done():
            self.future.set_result(None)


def _over(mark: Mark) -> bool:
    try:
        return mark.done()
    except AccyError:  # failed (or the device was lost): the full wait reports it
        return True


async def until_done(marks: Sequence[Mark], lost: Callable[[], bool]) -> bool:
    """Return once every mark's work is over (failures count); holds no thread.

    False if ``lost()`` turned true first (the device is gone: its work may never
    end, and notifications may never come).
    """
    loop = asyncio.get_running_loop()
    for mark in marks:
        if _over(mark):
            continue
        wake = _Wake(loop)
        with contextlib.suppress(AccyError):  # no notification: the polling still ends it
            mark.notify(wake.from_thread)
        period = POLL_FIRST_SECONDS
        while not _over(mark):
            if lost():
                return False
            timer = loop.call_later(period, wake.set)
            try:
                await wake.future
            finally:
                timer.cancel()
            wake.future = loop.create_future()
            period = min(period * 2, POLL_MOST_SECONDS)
    return True
