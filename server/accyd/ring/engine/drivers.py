"""The native engine's driver tables: the CUDA driver itself, or callbacks into a Python backend.

The engine launches a ticket as ``launch(exec, stream)`` and tracks its end with
pooled events, through a table of five C functions per device. For an in-process CUDA
backend they are the driver's own (``cuGraphLaunch``, ``cuEvent*``), loaded by the
engine from ``libcuda.so.1``, and the handles are the driver's: a ``CUgraphExec``, a
``CUstream``. For any other backend (host, a device worker's proxy, the tests' fakes)
they are ctypes callbacks into this module, which take the GIL and call the backend;
the handles are then keys of the objects here. Either way the engine's parser, tickets,
epochs and counters are the same C code.

A table driver also *patches*: a ticket with free scalars (``core/free_scalars.py``) matches
records whatever values they carry there, and before launching one with other values the
engine calls ``patch(exec, scalars, mask)``, which hands the prepared launch those values.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import structlog

from accyd.backends.base import Backend, Event, PreparedLaunch, ScalarChange, Stream
from accyd.core.tickets import FastLaunch
from accyd.errors import AccyError, LaunchFailed
from accyd.ring.records import free_fields

if TYPE_CHECKING:
    from accyd.ring.engine import _native

__all__ = ["CudaDriver", "Driver", "PythonDriver", "driver_for", "engine_ticket"]

log = structlog.get_logger("accyd.ring.engine")

NOT_READY = 600
"""What ``event_query`` answers for work not over yet (CUDA_ERROR_NOT_READY)."""
CALLBACK_ERROR = 999
"""A table driver's callback raised: the error is kept here, ``error(code)`` gives it."""

_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64)
_EVENT_CREATE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_uint64))
_EVENT_ONE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64)
_EVENT_RECORD = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64)
_PATCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint32)

SCALAR_BYTES = 64
"""What ``patch`` is given: a record's scalar bytes (``MAX_SCALARS`` fields of 8)."""

Patch = Callable[[bytes], list[ScalarChange]]
"""What a prepared launch takes for a record's scalar bytes (``FreeFields.changes``)."""


def _kept(error: BaseException) -> AccyError:
    """A callback's failure as the error its driver reports for the engine."""
    if isinstance(error, AccyError):
        return error
    log.error("engine callback failed", error=repr(error))
    return LaunchFailed(f"the engine's driver callback failed: {error!r}")


class _Patches:
    """A table's ``patch`` function: each handle's prepared launch (weakly: a stale ticket
    may name one that is gone) and how it reads a record's free scalars. A failure is
    answered ``CALLBACK_ERROR`` and handed to ``failed`` (the driver keeps it for
    ``error``). A handle may be used again for another launch once its own is gone (a
    CUDA graph instance's address): each entry is forgotten only while it is still that
    launch's."""

    def __init__(self, failed: Callable[[BaseException], int]) -> None:
        self._failed = failed
        self._entries: dict[int, tuple[weakref.ref[PreparedLaunch], Patch]] = {}
        self._function = _PATCH(self._patch)  # kept here: the engine holds its address

    @property
    def address(self) -> int:
        return ctypes.cast(self._function, ctypes.c_void_p).value or 0

    def add(self, handle: int, launch: PreparedLaunch, patch: Patch) -> None:
        entry = self._entries.get(handle)
        if entry is not None and entry[0]() is launch:
            self._entries[handle] = (entry[0], patch)
            return
        ref = weakref.ref(launch)
        self._entries[handle] = (ref, patch)
        weakref.finalize(launch, self._forget, handle, ref)

    def _forget(self, handle: int, ref: weakref.ref[PreparedLaunch]) -> None:
        entry = self._entries.get(handle)
        if entry is not None and entry[0] is ref:
            del self._entries[handle]

    def _patch(self, handle: int, scalars: int | None, mask: int) -> int:
        try:
            ref, patch = self._entries[handle]
            launch = ref()
            if launch is None or not scalars:
                raise LaunchFailed("the engine patched a launch that is gone")
            launch.set_scalars(patch(ctypes.string_at(scalars, SCALAR_BYTES)))
        except BaseException as error:
            return self._failed(error)
        return 0


class Driver(Protocol):
    """One device's table for the engine, and the handles of its objects."""

    kind: str
    """``cuda`` or ``table``."""
    patches: bool
    """Whether the engine may patch its launches' free scalars (``exec_handle``'s ``patch``)."""

    def table(self) -> dict[str, int]:
        """``set_driver``'s keyword arguments besides ``index`` and ``kind``."""
        ...

    def exec_handle(self, launch: PreparedLaunch, patch: Patch | None = None) -> int:
        """``launch``'s handle for the engine; with ``patch`` (only where ``patches``), how
        the engine's ``patch`` calls for it read a record's free scalars."""
        ...

    def stream_handle(self, stream: Stream) -> int: ...

    def error(self, code: int, what: str) -> AccyError:
        """The domain error for a result the engine met (``what``: the call)."""
        ...

    def retarget(self, backend: Backend) -> None:
        """``backend`` serves the device now (after a replacement)."""
        ...


class CudaDriver:
    """An in-process CUDA backend's own driver: the engine calls ``libcuda.so.1`` directly,
    but for ``patch``, a callback (it takes the GIL) that has the graph capture its stages
    with the record's values and update its instance in place (``GraphLaunch``)."""

    kind = "cuda"
    patches = True

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._error: AccyError | None = None
        self._patches = _Patches(self._failed)

    def table(self) -> dict[str, int]:
        context = int(getattr(self._backend, "context_handle"))  # noqa: B009
        return {"context": context, "patch": self._patches.address}

    def exec_handle(self, launch: PreparedLaunch, patch: Patch | None = None) -> int:
        handle = int(getattr(launch, "exec_handle"))  # noqa: B009
        if patch is not None:
            self._patches.add(handle, launch, patch)
        return handle

    def stream_handle(self, stream: Stream) -> int:
        return int(stream.native)

    def error(self, code: int, what: str) -> AccyError:
        kept, self._error = self._error, None
        if code == CALLBACK_ERROR and kept is not None:  # the patch's (999 is also CUDA's)
            return kept
        translate = getattr(self._backend, "driver_error")  # noqa: B009
        error: AccyError = translate(code, what)
        return error

    def _failed(self, error: BaseException) -> int:
        self._error = _kept(error)
        return CALLBACK_ERROR

    def retarget(self, backend: Backend) -> None:
        self._backend = backend


class PythonDriver:
    """Callbacks into a Python backend, for the engine's threads (each call takes the GIL).

    Handles are small integers standing for the objects kept here: prepared launches and
    streams weakly (a stale ticket may name one that is gone: it is never launched), the
    engine's pooled events strongly until it destroys them. A callback never raises into
    the engine: it answers ``CALLBACK_ERROR`` and keeps the error for ``error``.
    """

    kind = "table"
    patches = True

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._launches: weakref.WeakValueDictionary[int, PreparedLaunch] = (
            weakref.WeakValueDictionary()
        )
        self._launch_ids: dict[int, int] = {}
        """id() of a prepared launch -> its handle, while it lives."""
        self._patches = _Patches(self._failed)
        self._streams: weakref.WeakValueDictionary[int, Stream] = weakref.WeakValueDictionary()
        self._events: dict[int, Event | None] = {}
        self._error: AccyError | None = None
        # Kept here: the engine holds only their addresses.
        self._callbacks = (
            _LAUNCH(self._launch),
            _EVENT_CREATE(self._event_create),
            _EVENT_ONE(self._event_destroy),
            _EVENT_RECORD(self._event_record),
            _EVENT_ONE(self._event_query),
        )

    def table(self) -> dict[str, int]:
        names = ("launch", "event_create", "event_destroy", "event_record", "event_query")
        table = {
            name: ctypes.cast(fn, ctypes.c_void_p).value or 0
            for name, fn in zip(names, self._callbacks, strict=True)
        }
        return {**table, "patch": self._patches.address}

    def exec_handle(self, launch: PreparedLaunch, patch: Patch | None = None) -> int:
        with self._lock:
            key = id(launch)
            handle = self._launch_ids.get(key)
            if handle is None or self._launches.get(handle) is not launch:
                handle = next(self._ids)
                self._launches[handle] = launch
                self._launch_ids[key] = handle
                weakref.finalize(launch, self._launch_ids.pop, key, None)
            if patch is not None:
                self._patches.add(handle, launch, patch)
            return handle

    def stream_handle(self, stream: Stream) -> int:
        self._streams[stream.id] = stream
        return stream.id

    def error(self, code: int, what: str) -> AccyError:
        error, self._error = self._error, None
        if code == CALLBACK_ERROR and error is not None:
            return error
        return LaunchFailed(f"{what} failed with error {code}")

    def retarget(self, backend: Backend) -> None:
        self.backend = backend

    # The callbacks (engine threads, the GIL taken by ctypes) ------------------------------

    def _failed(self, error: BaseException) -> int:
        self._error = _kept(error)
        return CALLBACK_ERROR

    def _launch(self, handle: int, stream: int) -> int:
        try:
            launch = self._launches[handle]
            launch.launch(self._streams[stream])
        except BaseException as error:
            return self._failed(error)
        return 0

    def _event_create(self, out: ctypes._Pointer[ctypes.c_uint64]) -> int:
        handle = next(self._ids)
        self._events[handle] = None
        out[0] = handle
        return 0

    def _event_destroy(self, handle: int) -> int:
        event = self._events.pop(handle, None)
        if event is not None:
            try:
                self.backend.destroy_event(event)
            except BaseException as error:
                return self._failed(error)
        return 0

    def _event_record(self, handle: int, stream: int) -> int:
        try:
            old = self._events.get(handle)
            self._events[handle] = self.backend.record_event(self._streams[stream])
            if old is not None:
                self.backend.destroy_event(old)
        except BaseException as error:
            return self._failed(error)
        return 0

    def _event_query(self, handle: int) -> int:
        try:
            event = self._events.get(handle)
            if event is None:
                return 0
            if not self.backend.event_done(event):
                return NOT_READY
            self.backend.synchronize_event(event)  # over: a failure raises here
        except BaseException as error:
            return self._failed(error)
        return 0


def driver_for(backend: Backend) -> Driver:
    """The table for ``backend``: its own driver where it is an in-process CUDA device."""
    if hasattr(backend, "context_handle") and hasattr(backend, "driver_error"):
        return CudaDriver(backend)
    return PythonDriver(backend)


def engine_ticket(
    driver: Driver, fast: FastLaunch, key: bytes, stream: int, token: int, patch: bool = True
) -> tuple[_native.Ticket, bool]:
    """``fast`` as the engine's ticket for records whose launch bytes are ``key``, and
    whether the device launcher may take it too.

    With ``patch`` (and a driver that patches), a launch with free scalars gets a ticket
    that matches every value of them, patched in by the engine: never the device
    launcher's, which cannot patch a graph from the GPU. Otherwise the ticket is exact: it
    matches these values only. An exact ticket stays true to its launch, because only
    Python gives a launch other values then, and it revokes the launch's tickets first.
    An engine has tickets of one kind: a device launcher may be handed a ring's exact
    tickets, and must never find its graphs patched under them."""
    free = None if fast.free is None or not patch or not driver.patches else free_fields(fast.free)
    if free is None:
        handle = driver.exec_handle(fast.launch)
        return (key, fast.device, handle, stream, token, fast.epoch, fast.value), True
    handle = driver.exec_handle(fast.launch, free.changes)
    masked = free.masked(key)
    ticket = (masked, fast.device, handle, stream, token, fast.epoch, fast.value, free.engine)
    return ticket, False
