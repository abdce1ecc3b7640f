"""The host backend's streams: a worker thread per stream, and fences (its events).

A stream runs its tasks in order on its own thread; a fence is reached once
the work before it ran and carries that work's first error. Notifications run
quietly: what a waiter's callback raises never becomes the stream's error.

A short task given to an idle stream may run on the submitting thread instead
(``submit(here=True)``): handing it to the stream's thread and learning that it
ended costs two thread wake-ups, 30-80 µs each on a small machine, which is more
than a small kernel takes. ``RunTimes`` says which kernels are short.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Hashable

import structlog

from accyd.errors import AccyError, DeviceFault, LaunchFailed

__all__ = ["Fence", "RunTimes", "Worker", "call_quietly"]

_CALLBACKS = threading.Lock()
"""Guards the callbacks of every fence (rarely taken: only fences someone awaits have any)."""


def call_quietly(callback: Callable[[], None]) -> None:
    """Run a notification: nothing it raises may become the stream's error."""
    try:
        callback()
    except Exception:  # a waiter's bug, not the device's: the stream stays healthy
        structlog.get_logger("accyd.backends").exception("notification failed")


class Worker:
    """One stream's thread: runs submitted tasks in order; the first error waits for a sync.

    ``_queued`` counts tasks submitted and not yet over; ``_running`` is held by whoever
    runs a task, the stream's thread or a submitter running one here, so tasks never
    overlap and run in the order they were submitted.
    """

    def __init__(self, name: str, on_fault: Callable[[DeviceFault], None]) -> None:
        self._on_fault = on_fault
        self.dropping = False
        """Set when the stream is about to go: kernels not yet started are skipped."""
        self._tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._state = threading.Lock()
        self._queued = 0
        self._running = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            self._running.acquire()
            self._execute(task)

    def _execute(self, task: Callable[[], None]) -> None:
        """Run one task, ``_running`` held (released here, then the task counted over)."""
        try:
            task()
        except BaseException as error:  # reported at the next synchronize
            if isinstance(error, DeviceFault):
                self._on_fault(error)
            if self._error is None:
                self._error = error
        finally:
            self._running.release()
            with self._state:
                self._queued -= 1

    def submit(self, task: Callable[[], None], *, here: bool = False) -> None:
        """Queue ``task``; with ``here``, run it on this thread now if nothing is before it.

        Only a task known to be short may run here: the caller (an engine thread, the
        event loop) waits for it.
        """
        with self._state:
            here = here and self._queued == 0
            self._queued += 1
            if here:  # free: nothing queued or running; taken before any later submit
                self._running.acquire()
        if here:
            self._execute(task)
        else:
            self._tasks.put(task)

    def fence(self) -> Fence:
        fence = Fence(self)
        self.submit(fence.reach, here=True)
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


class RunTimes:
    """How long a kernel last took with given arguments, to tell which may run ``here``.

    One fact per key (a kernel, its geometry and scalar values): the seconds of its last
    run, replaced at each run. The table is emptied when it holds ``LIMIT`` keys, so a
    client varying its scalars cannot grow it; a key not in it is not known short.
    """

    LIMIT = 1024
    SHORT = 50e-6
    """A kernel this quick costs the caller less than the two hand-offs it saves."""

    def __init__(self) -> None:
        self._seconds: dict[Hashable, float] = {}

    def short(self, key: Hashable) -> bool:
        return self._seconds.get(key, self.SHORT) < self.SHORT

    def call(self, key: Hashable, function: Callable[..., None], *args: object) -> None:
        """``function(*args)``, noting how long it took under ``key`` (not if it raised)."""
        start = time.perf_counter()
        function(*args)
        seconds = time.perf_counter() - start
        if len(self._seconds) >= self.LIMIT:
            self._seconds.clear()
        self._seconds[key] = seconds
