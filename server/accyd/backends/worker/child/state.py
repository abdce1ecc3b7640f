"""The worker's state: the front's ids mapped to the backend's objects, kept errors, threads.

``ServedState`` holds what every op handler (``accyd.backends.worker.child.ops``) shares:
the tables, the thread pools (blocking ops on ``_calls``, frees in order on
``_frees``), the errors kept for streams, and the few helpers that answer a
round trip or keep a one-way op's error. See ``served``'s docstring for the rules.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NoReturn

from accyd.backends.base import (
    Backend,
    BackendKind,
    CompiledArtifact,
    DeviceBuffer,
    Event,
    LaunchRequest,
    LoadedKernel,
    PreparedLaunch,
    Stream,
)
from accyd.backends.worker.child.pins import SharedMappings
from accyd.backends.worker.child.watch import EventWatcher
from accyd.backends.worker.protocol import ALL_STREAMS, Op, encode_error
from accyd.catalog.dtypes import DType, Scalar
from accyd.catalog.model import FixedGeometry
from accyd.errors import DeviceFault, LaunchArgumentMismatch, LaunchFailed

__all__ = ["CALL_THREADS", "ServedState"]


CALL_THREADS = 32
"""Blocking ops running at once (a synchronize parks one thread until its stream is done)."""

_DTYPES = {dtype.value: dtype for dtype in DType}
_Recorded = tuple[Event | None, int | None, int]
"""An event (None: its record failed), its stream id, and its index among the stream's records."""


def _scalar(code: str, value: int | float) -> Scalar:
    """A ``Scalar`` the front built and checked already: no second check."""
    scalar = object.__new__(Scalar)
    object.__setattr__(scalar, "dtype", _DTYPES[code])
    object.__setattr__(scalar, "value", value)
    return scalar


class ServedState:
    """One worker's tables and helpers; owns the maps and pools (the backend is the caller's).

    ``send`` writes one frame under the worker's send lock; ``fatal`` reports a
    fault and ends the process.
    """

    def __init__(
        self,
        backend: Backend,
        send: Callable[[Any], None],
        fatal: Callable[[BaseException], NoReturn],
    ) -> None:
        self.backend = backend
        self._send = send
        self._fatal = fatal
        self.buffers: dict[int, DeviceBuffer] = {}
        self.kernels: dict[int, LoadedKernel] = {}
        self.artifacts: dict[int, CompiledArtifact] = {}
        self.prepared: dict[int, PreparedLaunch] = {}
        self.streams: dict[int, Stream] = {}
        self.events: dict[int, _Recorded] = {}
        self._records: dict[int | None, int] = {}
        self._errors: dict[int | None, tuple[int, BaseException]] = {}
        self._errors_lock = threading.Lock()
        self._writes: dict[int, list[Any]] = {}
        self.shared = SharedMappings(backend)
        self._geometry: dict[tuple[Any, Any], FixedGeometry] = {}
        self._calls = ThreadPoolExecutor(CALL_THREADS, "accy-worker-call")
        self._frees = ThreadPoolExecutor(1, "accy-worker-free")
        self._last_free: Future[None] | None = None
        self.watcher = EventWatcher(backend) if backend.kind is BackendKind.CUDA else None
        """Polls the events the front waits on (CUDA: sooner than a host function)."""

    # -- answering and keeping errors ----------------------------------------------------

    def _answer(self, call: int, work: Callable[[], Any]) -> None:
        """Run a round trip's work and send its answer; a fault ends the worker after it."""
        try:
            value = work()
        except BaseException as error:
            self._send((Op.FAILED, call, encode_error(error)))
            if isinstance(error, DeviceFault):
                self._fatal(error)
            return
        self._send((Op.REPLY, call, value))

    def _blocking(self, call: int, work: Callable[[], Any]) -> None:
        self._calls.submit(self._answer, call, work)

    def _failed(self, sid: int | None, error: BaseException) -> None:
        """A one-way op on stream ``sid`` failed: a fault ends the worker, else keep it."""
        if isinstance(error, DeviceFault):
            self._fatal(error)
        with self._errors_lock:
            if sid not in self._errors:
                self._errors[sid] = (self._records.get(sid, 0), error)

    def _raise_kept(self, sid: int | None, before: int | None = None) -> None:
        """Raise (once) the error kept for stream ``sid`` (for any stream: ``ALL_STREAMS``),
        after a wait for that stream succeeded; with ``before``, only an error kept before
        the stream's ``before``-th record. A wait that fails raises its own error first
        and leaves the kept one for the next."""
        with self._errors_lock:
            if sid == ALL_STREAMS:
                sid = next(iter(self._errors), None)
            kept = self._errors.get(sid)
            if kept is None or (before is not None and kept[0] >= before):
                return
            del self._errors[sid]
        raise kept[1]

    def _free(self, work: Callable[[], None]) -> None:
        self._last_free = self._frees.submit(work)

    def _notified(self, nid: int) -> Callable[[], None]:
        def notified() -> None:  # on the backend's thread: one frame, then back
            with contextlib.suppress(OSError):  # the front is gone: the main loop ends too
                self._send((Op.NOTIFIED, nid))

        return notified

    def _over(self, event: Event | None) -> bool:
        """Whether the work before ``event`` is over (failed counts), without blocking."""
        if event is None:
            return True
        try:
            return self.backend.event_done(event)
        except Exception:
            return True  # failed: its synchronize raises at once

    # -- lookups -------------------------------------------------------------------------

    def _stream(self, sid: int | None) -> Stream | None:
        if sid is None:
            return None
        stream = self.streams.get(sid)
        if stream is None:
            raise LaunchArgumentMismatch(f"stream {sid} is not alive")
        return stream

    def _buffer(self, bid: int) -> DeviceBuffer:
        buffer = self.buffers.get(bid)
        if buffer is None:
            raise LaunchArgumentMismatch(f"buffer {bid} is not allocated")
        return buffer

    def _request(self, sid: int | None, fields: Sequence[Any]) -> LaunchRequest:
        kid, bids, scalars, grid, block, shared, diagnostic = fields
        kernel = self.kernels.get(kid)
        if kernel is None:
            raise LaunchFailed(f"kernel {kid} is not loaded")
        buffers = self.buffers
        try:
            bound = [buffers[bid] for bid in bids]
        except KeyError:
            missing = [bid for bid in bids if bid not in buffers]
            raise LaunchFailed(f"buffers {missing} are not allocated") from None
        geometry = self._geometry.get((grid, block))
        if geometry is None:
            geometry = FixedGeometry(grid, block)
            if len(self._geometry) >= 1024:
                self._geometry.clear()
            self._geometry[grid, block] = geometry
        return LaunchRequest(
            None,
            kernel,
            bound,
            [_scalar(code, value) for code, value in scalars],
            geometry,
            self._stream(sid),
            shared,
            diagnostic,
        )

    # -- teardown ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Let blocking ops and frees finish, unpin and unmap the front's memory left, then
        close the backend (frees what is left)."""
        if self.watcher is not None:
            self.watcher.close()
        self._calls.shutdown(wait=True)
        self._frees.shutdown(wait=True)
        self.shared.close()
        self.backend.close()
