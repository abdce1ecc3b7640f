"""A fake driver table for the native engine: launches and events recorded, ends decided by
the test, errors injected; the engine's C code runs against it as it runs against CUDA."""

from __future__ import annotations

import ctypes
import itertools
import threading

from accyd.ring.engine.drivers import NOT_READY

__all__ = ["FakeDriver"]

_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64)
_EVENT_CREATE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_uint64))
_EVENT_ONE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64)
_EVENT_RECORD = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64)
_PATCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint32)


class FakeDriver:
    """Launches are appended to ``launches`` as (exec, stream), patches to ``patches`` as
    (exec, the record's 64 scalar bytes, mask); an event is over once ``finish_all`` was
    called after it was recorded."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.launches: list[tuple[int, int]] = []
        self.patches: list[tuple[int, bytes, int]] = []
        self.records: list[tuple[int, int]] = []
        """(event, stream) as recorded."""
        self._epoch = 1
        self._over = 0
        self._ids = itertools.count(1)
        self._events: dict[int, int] = {}
        """event -> the epoch it was recorded in (over once ``_over`` reaches it)."""
        self.live_events: set[int] = set()
        self.fail_launch: int = 0
        """Answer the next launch with this error (0: none)."""
        self.fail_query: int = 0
        self.fail_record: int = 0
        self.fail_patch: int = 0
        self.callbacks = (
            _LAUNCH(self._launch),
            _EVENT_CREATE(self._create),
            _EVENT_ONE(self._destroy),
            _EVENT_RECORD(self._record),
            _EVENT_ONE(self._query),
            _PATCH(self._patch),
        )

    def table(self) -> dict[str, int]:
        names = ("launch", "event_create", "event_destroy", "event_record", "event_query", "patch")
        return {
            name: ctypes.cast(fn, ctypes.c_void_p).value or 0
            for name, fn in zip(names, self.callbacks, strict=True)
        }

    def finish_all(self) -> None:
        """Everything recorded so far is over."""
        with self.lock:
            self._over = self._epoch
            self._epoch += 1

    def _launch(self, exec_handle: int, stream: int) -> int:
        with self.lock:
            if self.fail_launch:
                code, self.fail_launch = self.fail_launch, 0
                return code
            self.launches.append((exec_handle, stream))
        return 0

    def _patch(self, exec_handle: int, scalars: int | None, mask: int) -> int:
        with self.lock:
            if self.fail_patch:
                code, self.fail_patch = self.fail_patch, 0
                return code
            self.patches.append((exec_handle, ctypes.string_at(scalars or 0, 64), mask))
        return 0

    def _create(self, out: ctypes._Pointer[ctypes.c_uint64]) -> int:
        handle = next(self._ids)
        with self.lock:
            self.live_events.add(handle)
        out[0] = handle
        return 0

    def _destroy(self, handle: int) -> int:
        with self.lock:
            self.live_events.discard(handle)
        return 0

    def _record(self, handle: int, stream: int) -> int:
        with self.lock:
            if self.fail_record:
                code, self.fail_record = self.fail_record, 0
                return code
            self._events[handle] = self._epoch
            self.records.append((handle, stream))
        return 0

    def _query(self, handle: int) -> int:
        with self.lock:
            if self.fail_query:
                code, self.fail_query = self.fail_query, 0
                return code
            return 0 if self._over >= self._events.get(handle, 0) else NOT_READY
