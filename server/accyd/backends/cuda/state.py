"""The state every part of the CUDA backend shares, and its context handling.

``CudaBackend`` (``backend.py``) is one and sets these fields in its constructor; the
``Kernels`` (``kernels.py``) and ``Events`` (``events.py``) it holds read them through it.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

from accyd.backends.base import DeviceBuffer, Event, LoadedKernel, Stream
from accyd.backends.cuda.compile_cache import CompileCache
from accyd.backends.cuda.driver import ErrorCheck
from accyd.backends.cuda.partitions import GreenContexts
from accyd.errors import LaunchArgumentMismatch, LaunchFailed, Unavailable

__all__ = ["CURRENT", "TOKENS", "DriverState"]

# The context each thread last made current (cuCtxSetCurrent is per thread); shared by
# every backend object so that two devices used from one thread switch correctly.
CURRENT = threading.local()
# Each backend object gets its own token, so a thread re-binds after a context was released
# and retained again by a new backend object (the handle value may repeat).
TOKENS = itertools.count(1)


class DriverState:
    """One device's driver handles and tables, shared by the backend's parts.

    Nothing here allocates or frees: ``CudaBackend`` owns what the tables track.
    """

    _cu: Any
    device_ordinal: int
    cache: CompileCache
    compute_capability: tuple[int, int]
    _check: ErrorCheck
    _ids: itertools.count[int]
    _lock: threading.Lock
    _closed: bool
    _buffers: dict[int, DeviceBuffer]
    _kernels: dict[int, LoadedKernel]
    _streams: dict[int, Stream]
    _events: dict[int, Event]
    _event_pool: list[Any]
    _callbacks: dict[int, Callable[[], None]]
    _callback_ids: itertools.count[int]
    _host_fn_handle: Any
    _ctx: Any
    _ctx_key: int
    _default_stream: Any
    _device: Any
    driver_version: int
    _green: GreenContexts
    """The device's SM partitions (``cuda/partitions.py``)."""

    def _make_current(self) -> None:
        self._check(self._cu.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
        CURRENT.ctx = self._ctx_key

    def _enter(self) -> None:
        """Refuse a closed or poisoned backend; make the context current on this thread."""
        if self._closed:
            raise Unavailable(f"the CUDA backend of device {self.device_ordinal} is closed")
        self._check.healthy()
        if getattr(CURRENT, "ctx", None) != self._ctx_key:
            self._make_current()

    def _stream_handle(self, stream: Stream | None) -> Any:
        if stream is None:
            return self._default_stream
        if self._streams.get(stream.id) is not stream:
            raise LaunchArgumentMismatch(f"stream {stream.id} is not a live stream of this backend")
        return stream.native

    def _live_buffer(self, buffer: DeviceBuffer) -> DeviceBuffer:
        if self._buffers.get(buffer.id) is not buffer:
            raise LaunchArgumentMismatch(f"buffer {buffer.id} is not a live buffer of this backend")
        return buffer

    def _free_native(self, call: Callable[[], Any], what: str) -> None:
        """Run a freeing call; after a fault the driver refuses it, which changes nothing."""
        if self._check.fault is not None:
            call()
            return
        if getattr(CURRENT, "ctx", None) != self._ctx_key:
            self._make_current()
        self._check(call(), what, LaunchFailed)
