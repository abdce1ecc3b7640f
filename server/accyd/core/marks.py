"""Marks: recorded device events shared by every holder, destroyed when the last one lets go.

A launch records one event on its session's stream; the launch log and every
buffer the launch touched hold the same mark. ``wait`` blocks the calling
thread, so it runs off the event loop, with a reference held for its duration.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from accyd.backends.base import Backend, Event, Stream

__all__ = ["Mark", "order_after"]


class Mark:
    """One recorded event with a reference count; the creator holds the first reference."""

    __slots__ = ("_lock", "_refs", "backend", "event", "stream_id")

    def __init__(self, backend: Backend, stream: Stream) -> None:
        self.backend = backend
        self.event: Event = backend.record_event(stream)
        self.stream_id = stream.id
        self._refs = 1
        self._lock = threading.Lock()

    def retain(self) -> Mark:
        with self._lock:
            if self._refs <= 0:
                raise RuntimeError("retain of a released mark")
            self._refs += 1
        return self

    def release(self) -> None:
        with self._lock:
            self._refs -= 1
            last = self._refs == 0
        if last:
            self.backend.destroy_event(self.event)

    def done(self) -> bool:
        return self.backend.event_done(self.event)

    def wait(self) -> None:
        """Block until the recorded work finished (call off the event loop)."""
        self.backend.synchronize_event(self.event)


def order_after(backend: Backend, stream: Stream, marks: Iterable[Mark]) -> None:
    """Make later work on ``stream`` wait for each mark recorded on another stream."""
    for mark in marks:
        if mark.stream_id != stream.id:
            backend.wait_event(stream, mark.event)
