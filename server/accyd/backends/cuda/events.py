"""The CUDA backend's streams, events, host-function notifications and synchronization."""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from accyd.backends.base import Event, Stream
from accyd.backends.cuda.state import DriverState
from accyd.backends.partitions import PartitionSpec, SmSplit
from accyd.errors import LaunchArgumentMismatch, LaunchFailed

__all__ = ["HOST_FN", "Events"]

_EVENT_POOL_MAX = 256

HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
"""The C signature of a CUhostFn: ``void fn(void* user_data)``."""


def _log_callback_error() -> None:
    logging.getLogger(__name__).exception("a stream notification callback failed")


class Events:
    """A device's streams and events, for its ``CudaBackend``: every stream and event it
    hands out is tracked in the device's tables until ``destroy_stream`` / ``destroy_event``
    (events go back to a pool)."""

    def __init__(self, state: DriverState) -> None:
        """``state``: the device's driver handles and tables (its ``CudaBackend``)."""
        self._state = state

    # -- streams, events, synchronization ------------------------------------------------------

    def synchronize(self, stream: Stream | None = None) -> None:
        """Wait for ``stream``'s work; ``None`` waits for the whole device (cuCtxSynchronize)."""
        self._state._enter()
        if stream is None:
            self._state._check(self._state._cu.cuCtxSynchronize(), "cuCtxSynchronize", LaunchFailed)
        else:
            self._state._check(
                self._state._cu.cuStreamSynchronize(self._state._stream_handle(stream)),
                "cuStreamSynchronize",
                LaunchFailed,
            )

    def create_stream(self, partition: str | None = None, priority: int = 0) -> Stream:
        """A non-blocking stream, in a green context's partition if named; ``priority`` 0 and
        up (up runs first) is CUDA's 0 and down, which the driver clamps to its range."""
        self._state._enter()
        cu = self._state._cu
        flags = cu.CUstream_flags.CU_STREAM_NON_BLOCKING
        if partition is not None:
            handle = self._state._green.stream(cu, self._state._check, partition, -priority)
        elif priority:
            handle = self._state._check(
                cu.cuStreamCreateWithPriority(flags, -priority), "cuStreamCreateWithPriority"
            )
        else:
            handle = self._state._check(cu.cuStreamCreate(flags), "cuStreamCreate")
        stream = Stream(id=next(self._state._ids), native=handle, partition=partition)
        with self._state._lock:
            self._state._streams[stream.id] = stream
        return stream

    def split_sms(self, specs: Sequence[PartitionSpec]) -> SmSplit:
        """The device's SMs split into green contexts, once (``cuda/partitions.py``)."""
        self._state._enter()
        return self._state._green.make(
            self._state._cu,
            self._state._check,
            self._state._device,
            self._state.driver_version,
            specs,
        )

    def destroy_stream(self, stream: Stream) -> None:
        """Destroy a stream; work already queued on it still completes (CUDA's rule)."""
        if self._state._closed:
            return
        with self._state._lock:
            if self._state._streams.get(stream.id) is not stream:
                return
            del self._state._streams[stream.id]
        self._state._free_native(
            lambda: self._state._cu.cuStreamDestroy(stream.native), "cuStreamDestroy"
        )

    def record_event(self, stream: Stream | None) -> Event:
        self._state._enter()
        cu = self._state._cu
        handle = self._state._stream_handle(stream)
        with self._state._lock:
            native = self._state._event_pool.pop() if self._state._event_pool else None
        if native is None:
            native = self._state._check(
                cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate"
            )
        try:
            self._state._check(cu.cuEventRecord(native, handle), "cuEventRecord", LaunchFailed)
        except BaseException:
            cu.cuEventDestroy(native)
            raise
        event = Event(id=next(self._state._ids), native=native)
        with self._state._lock:
            self._state._events[event.id] = event
        return event

    def _live_event(self, event: Event) -> Any:
        if self._state._events.get(event.id) is not event:
            raise LaunchArgumentMismatch(f"event {event.id} is not a live event of this backend")
        return event.native

    def wait_event(self, stream: Stream | None, event: Event) -> None:
        self._state._enter()
        self._state._check(
            self._state._cu.cuStreamWaitEvent(
                self._state._stream_handle(stream), self._live_event(event), 0
            ),
            "cuStreamWaitEvent",
            LaunchFailed,
        )

    def notify(self, stream: Stream | None, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the driver's host-function thread after the stream's work."""
        self._state._enter()
        key = next(self._state._callback_ids)
        with self._state._lock:
            self._state._callbacks[key] = callback
        try:
            self._state._check(
                self._state._cu.cuLaunchHostFunc(
                    self._state._stream_handle(stream), self._state._host_fn_handle, key
                ),
                "cuLaunchHostFunc",
                LaunchFailed,
            )
        except BaseException:
            with self._state._lock:
                self._state._callbacks.pop(key, None)
            raise

    def notify_event(
        self, event: Event, stream: Stream | None, callback: Callable[[], None]
    ) -> None:
        """After the stream's work so far (which includes ``event``): a host function."""
        self.notify(stream, callback)

    def drop_queued(self, stream: Stream) -> None:
        """Nothing: what was enqueued belongs to the driver and runs."""

    def run_callback(self, user_data: int | None) -> None:
        """The host function's Python side (``HOST_FN``): the callback ``notify`` registered
        under ``user_data``, once."""
        with self._state._lock:
            callback = self._state._callbacks.pop(user_data or 0, None)
        if callback is not None:
            try:
                callback()
            except Exception:  # nothing may escape into the driver's thread
                _log_callback_error()

    def event_done(self, event: Event) -> bool:
        self._state._enter()
        cu = self._state._cu
        (err,) = cu.cuEventQuery(self._live_event(event))
        if not err:
            return True
        if err == cu.CUresult.CUDA_ERROR_NOT_READY:
            return False
        raise self._state._check.error(err, "cuEventQuery", LaunchFailed)

    def wait_event_for(self, event: Event, seconds: float) -> bool:
        """Poll the event (the GIL is let go in each query) for at most ``seconds``."""
        self._state._enter()
        query, native = self._state._cu.cuEventQuery, self._live_event(event)
        not_ready = self._state._cu.CUresult.CUDA_ERROR_NOT_READY
        deadline = time.perf_counter() + seconds
        while True:
            (err,) = query(native)
            if err != not_ready:
                return True  # finished, or failed: the full wait reports which
            if time.perf_counter() >= deadline:
                return False

    def synchronize_event(self, event: Event) -> None:
        self._state._enter()
        self._state._check(
            self._state._cu.cuEventSynchronize(self._live_event(event)),
            "cuEventSynchronize",
            LaunchFailed,
        )

    def destroy_event(self, event: Event) -> None:
        if self._state._closed:
            return
        with self._state._lock:
            if self._state._events.get(event.id) is not event:
                return
            del self._state._events[event.id]
            if len(self._state._event_pool) < _EVENT_POOL_MAX and self._state._check.fault is None:
                # Re-recording an event is allowed while earlier records are pending.
                self._state._event_pool.append(event.native)
                return
        self._state._free_native(
            lambda: self._state._cu.cuEventDestroy(event.native), "cuEventDestroy"
        )
