"""The host backend's streams: a worker thread per stream, and fences (its events).

A stream runs its tasks in order on its own thread; a fence is reached once
the work before it ran and carries that work's first error. Notifications run
quietly: what a waiter's callback raises never becomes the stream's error.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

import structlog

from accyd.errors import AccyError, DeviceFault, LaunchFailed

__all__ = ["Fence", "Worker", "call_quietly"]

_CALLBACKS = threading.Lock()
"""Guards the callbacks of every fence (rarely taken: only fences someone awaits have any)."""


def call_quietly(callback: Callable[[], None]) -> None:
    """Run a notification: nothing it raises may become the stream's error."""
    try:
        callback()
    except Exception:  # a waiter's bug, not the device's: the stream stays healthy
        structlog.get_logger("accyd.backends").exception("notification failed")


class Worker:
    """One stream's thread: runs submitted tasks in order; the first error waits for a sync."""

    def __init__(self, name: str, on_fault: Callable[[DeviceFault], None]) -> None:
        self._on_fault = on_fault
        self.dropping = False
        """Set when the stream is about to go: kernels not yet started are skipped."""
        self._tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            try:
                task()
            except BaseException as error:  # reported at the next synchronize
                if isinstance(error, DeviceFault):
                    self._on_fault(error)
                if self._error is None:
                    self._error = error

    def submit(self, task: Callable[[], None]) -> None:
        self._tasks.put(task)

    def fence(self) -> Fence:
        fence = Fence(self)
        self._tasks.put(fence.reach)
        return fence

    def take_error(self, error: BaseException | None) -> None:
        """Raise ``error`` (a failure of work before a fence) once, as a domain error."""
        if error is None:
            return
        if self._error is error:
            self._error = None
        if isinstance(error, AccyError):
            raise error
        raise LaunchFailed(f"host kernel failed: {type(error).__name__}: {error}") from error

    def synchronize(self) -> None:
        fence = self.fence()
        fence.done.wait()
        self.take_error(fence.error)

    def stop(self) -> None:
        self._tasks.put(None)
        self._thread.join()


class Fence:
    """A point in a stream: set once the work before it ran, with that work's first error."""

    __slots__ = ("callbacks", "done", "error", "worker")

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.callbacks: list[Callable[[], None]] | None = None

    def reach(self) -> None:
        self.error = self.worker._error
        self.done.set()
        if self.callbacks is not None:
            with _CALLBACKS:
                callbacks, self.callbacks = self.callbacks, None
            for callback in callbacks or ():
                call_quietly(callback)

    def when_reached(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once reached (at once, here, if it already was)."""
        with _CALLBACKS:
            if not self.done.is_set():
                if self.callbacks is None:
                    self.callbacks = []
                self.callbacks.append(callback)
                return
        call_quietly(callback)

    def synchronize(self) -> None:
        self.done.wait()
        self.worker.take_error(self.error)
