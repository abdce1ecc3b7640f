"""Waiting for device work without holding a thread: completions reach the event loop.

A wait is split in two: what to wait for (retained marks) and what to do once
their work is over (``Deferred.then``: frees, reaps, error reports, all quick by
then). A thread runs both in a row (``finish``, blocking); the event loop awaits
the marks through the backend's notifications (``settle``) and then runs the
rest, so no thread is parked while the device works. Where there is no loop
(the ring's copies), ``call_when_done`` does the same with callbacks: the
backend's notification, and a poll on one shared thread behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from accyd.core.marks import Mark
from accyd.errors import AccyError

__all__ = [
    "POLL_FIRST_SECONDS",
    "POLL_MOST_SECONDS",
    "Deferred",
    "call_when_done",
    "over",
    "until_done",
]

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


def over(mark: Mark) -> bool:
    """Whether ``mark``'s work is over (a failure counts: the full wait reports it)."""
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
        if over(mark):
            continue
        wake = _Wake(loop)
        with contextlib.suppress(AccyError):  # no notification: the polling still ends it
            mark.notify(wake.from_thread)
        period = POLL_FIRST_SECONDS
        while not over(mark):
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


@dataclass(eq=False, slots=True)
class _Waiting:
    """Marks waited for by callback: ``then`` runs once, when they are all over."""

    marks: list[Mark]
    then: Callable[[], None]
    lost: Callable[[], bool]
    period: float = POLL_FIRST_SECONDS
    poll_at: float = field(default_factory=lambda: time.monotonic() + POLL_FIRST_SECONDS)
    lock: threading.Lock = field(default_factory=threading.Lock)
    ran: bool = False

    def check(self) -> bool:
        """Whether it is finished: ran ``then`` now or before (from any thread)."""
        with self.lock:
            if self.ran:
                return True
            while self.marks and over(self.marks[0]):
                self.marks.pop(0)
            if self.marks and not self.lost():
                return False
            self.ran = True
        self.then()
        return True

    def arm(self) -> None:
        """Ask to hear of the first mark not over yet (late or never is fine: polled too).
        The notification holds a reference of its own to the mark until it comes."""
        with self.lock:
            if self.ran or not self.marks:
                return
            first = self.marks[0].retain()

        def notified() -> None:
            try:
                if not self.check():
                    self.arm()
            finally:
                first.release()

        try:
            first.notify(notified)
        except AccyError:
            first.release()


class _Poller:
    """One thread for every callback wait: looks at each now and then, as a lost device
    may never deliver its notifications (the notification is the fast path)."""

    def __init__(self) -> None:
        self._waiting: list[_Waiting] = []
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, waiting: _Waiting) -> None:
        with self._lock:
            self._waiting.append(waiting)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="accyd-waits", daemon=True)
                self._thread.start()
            self._lock.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._waiting:
                    self._lock.wait()
                now = time.monotonic()
                due = [w for w in self._waiting if w.poll_at <= now]
                soonest = min(w.poll_at for w in self._waiting)
            for waiting in due:
                finished = waiting.ran or waiting.check()
                with self._lock:
                    if finished:
                        self._waiting.remove(waiting)
                    else:
                        waiting.period = min(waiting.period * 2, POLL_MOST_SECONDS)
                        waiting.poll_at = time.monotonic() + waiting.period
            if not due:
                time.sleep(max(0.0, min(soonest - time.monotonic(), POLL_FIRST_SECONDS)))


_poller = _Poller()


def call_when_done(
    marks: Sequence[Mark], then: Callable[[], None], lost: Callable[[], bool]
) -> None:
    """Run ``then`` once every mark's work is over (or ``lost()`` turned true), from whichever
    thread sees it first: this one if they are over already. Holds no thread meanwhile;
    the caller keeps its references to the marks until ``then`` runs."""
    waiting = _Waiting(list(marks), then, lost)
    if waiting.check():
        return
    waiting.arm()
    if not waiting.ran:
        _poller.add(waiting)
