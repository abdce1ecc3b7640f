"""The worker's event watcher: a thread that polls the events the front waits on.

A CUDA host function (``Backend.notify_event``) wakes its callback tens of
microseconds after the work, through the driver's own thread; a thread that
queries the watched events (``cuEventQuery``, about a microsecond each) sees them
over sooner, and a waited launch's round trip is that much shorter. It spins
(yielding the GIL with ``sched_yield``) only while something is watched and
only where the process may use ``SPIN_CPUS`` CPUs or more; elsewhere it naps
between sweeps. The worker hands it an event, a callback and ``otherwise``; it
calls the callback once the event is over, or ``otherwise`` (the worker then
registers the stream-ordered host function) for an event it cannot query
(failed work, a fault), so a callback never runs before its work is over.
The worker destroys events only through ``destroy``: one being watched is
destroyed once its watch ends, so a recycled handle is never mistaken for it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from accyd.backends.base import Backend, Event

__all__ = ["SPIN_CPUS", "EventWatcher"]

SPIN_CPUS = 8
"""Spin between sweeps where the process may use this many CPUs, else nap."""
NAP_SECONDS = 50e-6


class EventWatcher:
    """Polls watched events on a thread of its own; ``close()`` ends it (idempotent)."""

    def __init__(self, backend: Backend, *, spin: bool | None = None) -> None:
        self._backend = backend
        self._spin = len(os.sched_getaffinity(0)) >= SPIN_CPUS if spin is None else spin
        self._lock = threading.Condition()
        self._watched: list[tuple[Event, Callable[[], None], Callable[[], None]]] = []
        self._doomed: set[int] = set()
        """ids of watched events the front destroyed: destroyed when their watch ends."""
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="accy-worker-watch", daemon=True)
        self._thread.start()

    def watch(
        self, event: Event, callback: Callable[[], None], otherwise: Callable[[], None]
    ) -> None:
        """Call ``callback`` (on the watcher's thread) once ``event``'s work is over, or
        ``otherwise`` if the event cannot be queried."""
        with self._lock:
            self._watched.append((event, callback, otherwise))
            self._lock.notify()

    def destroy(self, event: Event) -> None:
        """Destroy ``event`` now, or once its watch ends if it is watched."""
        with self._lock:
            if any(watched[0] is event for watched in self._watched):
                self._doomed.add(id(event))
                return
        self._backend.destroy_event(event)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(1.0)

    def _run(self) -> None:
        backend = self._backend
        while True:
            with self._lock:
                while not self._watched and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                watched = list(self._watched)
            over: list[tuple[Event, Callable[[], None], Callable[[], None]]] = []
            calls: list[Callable[[], None]] = []
            for entry in watched:
                event, callback, otherwise = entry
                try:
                    if not backend.event_done(event):
                        continue
                    calls.append(callback)
                except Exception:  # failed work or a fault: the stream's own order decides
                    calls.append(otherwise)
                over.append(entry)
            if not over:
                if self._spin:
                    os.sched_yield()
                else:
                    time.sleep(NAP_SECONDS)
                continue
            with self._lock:
                ended = {id(entry) for entry in over}
                self._watched = [w for w in self._watched if id(w) not in ended]
                still = {id(w[0]) for w in self._watched}
                doomed = [e for e, _, _ in over if id(e) in self._doomed and id(e) not in still]
                for event in doomed:
                    self._doomed.discard(id(event))
            for call in calls:
                call()
            for event in doomed:
                try:
                    backend.destroy_event(event)
                except Exception:  # a fault: the worker is ending anyway
                    continue
