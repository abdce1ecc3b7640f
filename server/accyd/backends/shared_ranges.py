"""Host memory a backend was told will be copied often (``pin_host``), and whether it is locked.

``pin_host`` used to page-lock the memory at once: for a fresh 1 GiB segment
that is about 0.8 s on the H200, paid by the segment's first copy. Now it
only records the range, and copies from or to it go through the backend's
staging pool (``accyd.backends.staging``) until the range has earned its
locking: once its copies moved ``REGISTER_AFTER`` times its size, it is
locked in the background (one range at a time, on a thread of its own), and
copies after that go to the DMA engine directly, at the locked-memory rate.
A segment used once never pays for locking; one used many times pays once,
about as much as a few dozen of its staged copies saved.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from accyd.backends.base import DeviceBuffer, Stream
from accyd.backends.staging import STAGE_FROM_BYTES, LazyStaging, Staging, address_of

__all__ = ["REGISTER_AFTER", "SharedRange", "SharedRanges", "StagedCopies"]

REGISTER_AFTER = 8
"""How many times its size a range's copies move before it is locked in the background."""


class SharedRange:
    """One ``pin_host``'d memory: ``pin_host``'s token. ``registered`` once it is locked."""

    __slots__ = ("anchor", "base", "done", "end", "memory", "moved", "queued", "registered")

    def __init__(self, memory: memoryview) -> None:
        self.memory = memory
        self.base = address_of(memory)
        self.end = self.base + memory.nbytes
        self.moved = 0
        self.queued = False
        self.registered = False
        self.anchor: object = None
        """What the backend's ``register`` returned (it unregisters with it)."""
        self.done = threading.Event()
        """Set once it will not be registered any more (registered, failed, or removed)."""


class SharedRanges:
    """The ranges of one backend; ``register`` / ``unregister`` lock and unlock one (``None``:
    nothing to lock, as on the host backend: a range then counts as locked once due)."""

    def __init__(
        self,
        register: Callable[[memoryview], object] | None,
        unregister: Callable[[object], None] | None,
        *,
        register_after: float = REGISTER_AFTER,
    ) -> None:
        self._register = register
        self._unregister = unregister
        self.register_after = register_after
        self._ranges: list[SharedRange] = []
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[SharedRange | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def add(self, memory: memoryview) -> SharedRange:
        shared = SharedRange(memory)
        with self._lock:
            self._ranges.append(shared)
        return shared

    @property
    def has_ranges(self) -> bool:
        return bool(self._ranges)

    def find(self, view: memoryview) -> SharedRange | None:
        """The range ``view`` lies wholly inside, if any."""
        if not self._ranges:
            return None
        start = address_of(view)
        end = start + view.nbytes
        with self._lock:
            for shared in self._ranges:
                if shared.base <= start and end <= shared.end:
                    return shared
        return None

    def moved(self, shared: SharedRange, size: int) -> None:
        """``size`` bytes were copied through staging from or to ``shared``: lock it in the
        background once it has moved enough."""
        shared.moved += size
        if shared.queued or shared.moved < self.register_after * shared.memory.nbytes:
            return
        shared.queued = True
        if self._register is None:
            shared.registered = True
            shared.done.set()
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._registering, name="accyd-pin", daemon=True
                )
                self._thread.start()
        self._queue.put(shared)

    def _registering(self) -> None:
        assert self._register is not None
        while (shared := self._queue.get()) is not None:
            try:
                with self._lock:
                    gone = shared not in self._ranges
                if not gone:
                    shared.anchor = self._register(shared.memory)
                    shared.registered = True
            except Exception:  # no locked memory left: its copies stay staged
                pass
            finally:
                shared.done.set()

    def remove(self, shared: object) -> None:
        """Forget a range (``unpin_host``): after its registration, if one is under way, and
        unlocked if it was locked."""
        if not isinstance(shared, SharedRange):
            return
        with self._lock:
            if shared not in self._ranges:
                return
            self._ranges.remove(shared)
        if shared.queued and self._register is not None:
            shared.done.wait()
        if shared.registered and self._unregister is not None:
            self._unregister(shared.anchor)
        shared.registered = False

    def close(self) -> None:
        """Stop the registering thread (the ranges left are the backend's to drop)."""
        self._queue.put(None)


class StagedCopies:
    """A backend's copies of shared memory not locked yet: through its staging, counted."""

    def __init__(self, ranges: SharedRanges, staging: LazyStaging[Any]) -> None:
        self.ranges = ranges
        self.staging = staging

    def _staged(self, view: memoryview) -> tuple[SharedRange, Staging[Any]] | None:
        if view.nbytes < STAGE_FROM_BYTES or not self.ranges.has_ranges:
            return None
        shared = self.ranges.find(view)
        if shared is None or shared.registered:
            return None
        staging = self.staging.get()
        return None if staging is None else (shared, staging)

    def write(
        self, buffer: DeviceBuffer, offset: int, view: memoryview, stream: Stream | None
    ) -> bool:
        """Copy ``view`` in through staging if it should be; whether it was (else the caller
        copies it as it is)."""
        return self._move(True, buffer, offset, view, stream)

    def read_into(
        self, buffer: DeviceBuffer, offset: int, view: memoryview, stream: Stream | None
    ) -> bool:
        """``write``'s other way."""
        return self._move(False, buffer, offset, view, stream)

    def _move(
        self,
        to_buffer: bool,
        buffer: DeviceBuffer,
        offset: int,
        view: memoryview,
        stream: Stream | None,
    ) -> bool:
        found = self._staged(view)
        if found is None:
            return False
        shared, staging = found
        copy = staging.write if to_buffer else staging.read_into
        copy(buffer, offset, view, stream)
        self.ranges.moved(shared, view.nbytes)
        return True

    def close(self) -> None:
        self.ranges.close()
        self.staging.close()  # a background make finishes first: its slots are freed after
        staging = self.staging.peek()
        if staging is not None:
            staging.close()
