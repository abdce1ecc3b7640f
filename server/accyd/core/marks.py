"""Marks: recorded device events shared by every holder, destroyed when the last one lets go.

A launch records one event on its session's stream; the launch log and every
buffer the launch touched hold the same mark. ``wait`` blocks the calling
thread, so it runs off the event loop, with a reference held for its duration;
``notify`` calls back once the work is over (``accyd.core.waits`` awaits that).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from accyd.backends.base import Backend, Event, Stream
from accyd.errors import AccyError

__all__ = ["Mark", "MarkWatch", "order_after"]


class Mark:
    """One recorded event with a reference count; the creator holds the first reference."""

    __slots__ = ("_lock", "_refs", "backend", "event", "stream", "stream_id")

    def __init__(self, backend: Backend, stream: Stream) -> None:
        self.backend = backend
        self.event: Event = backend.record_event(stream)
        self.stream = stream
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

    def notify(self, callback: Callable[[], None]) -> None:
        """Have ``callback`` called, from another thread, once the recorded work is over.

        The caller holds a reference until then. Backends may call it late (after
        the stream's work so far), never early; errors are for the next ``wait``.
        """
        self.backend.notify_event(self.event, self.stream, callback)


class MarkWatch:
    """A waiter's hold on one launch's mark: wait for it briefly, or be called back when done.

    ``Daemon.launch`` makes one for a launch its caller will wait for, right
    after enqueueing it on ``stream``; the waiter must ``close()`` it (that lets
    the mark go). Nothing here raises: a failure is reported by the full wait
    that follows (``Daemon.wait_launch``).
    """

    __slots__ = ("_mark", "_stream")

    def __init__(self, mark: Mark, stream: Stream) -> None:
        self._mark: Mark | None = mark.retain()
        self._stream = stream

    def settle(self, seconds: float) -> bool:
        """Block at most ``seconds`` for the launch; whether it is over (failed counts)."""
        mark = self._mark
        if mark is None or seconds <= 0:
            return False
        try:
            return mark.backend.wait_event_for(mark.event, seconds)
        except AccyError:
            return True

    def done(self) -> bool:
        """Whether the launch is over (a failed one counts: the full wait reports it)."""
        mark = self._mark
        if mark is None:
            return True
        try:
            return mark.done()
        except AccyError:
            return True

    @property
    def backend(self) -> Backend | None:
        """The backend the launch ran on (``None`` once closed)."""
        return None if self._mark is None else self._mark.backend

    def outcome(self) -> None:
        """Raise what the launch failed with, if it failed (call once ``done()``)."""
        mark = self._mark
        if mark is not None:
            mark.wait()

    def notify(self, callback: Callable[[], None]) -> bool:
        """Have ``callback`` called (from another thread) once the stream's work so far is done.

        Whether the backend took it; call it right after the launch, before more
        work is queued on the stream, or the callback also waits for that work.
        """
        mark = self._mark
        if mark is None:
            return False
        try:
            mark.backend.notify(self._stream, callback)
        except AccyError:
            return False
        return True

    def close(self) -> None:
        """Let the mark go; idempotent."""
        mark, self._mark = self._mark, None
        if mark is not None:
            mark.release()


def order_after(backend: Backend, stream: Stream, marks: Iterable[Mark]) -> None:
    """Make later work on ``stream`` wait for each mark recorded on another stream."""
    for mark in marks:
        if mark.stream_id != stream.id:
            backend.wait_event(stream, mark.event)
