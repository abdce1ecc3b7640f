"""The host backend: buffers in host memory, ordered streams on worker threads, numpy kernels.

It is the embedded default where there is no GPU and what CI runs. Kernels are
Python functions over whole grids (format ``host_py``), and they compute the
same results as the CUDA kernels of the same contract.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import threading
from collections.abc import Callable, Sequence
from types import CodeType
from typing import Any

import numpy as np
import numpy.typing as npt

from accyd.backends.base import (
    BUFFER_ALIGNMENT,
    ArtifactRequest,
    BackendKind,
    CompiledArtifact,
    DeviceBuffer,
    Event,
    Exported,
    ExportKind,
    LaunchRequest,
    LoadedKernel,
    PreparedLaunch,
    SequentialLaunch,
    Stream,
    round_up,
)
from accyd.backends.host_staging import host_staged_copies
from accyd.backends.host_streams import Fence, RunTimes, Worker, call_quietly
from accyd.backends.partitions import PartitionSpec, SmSplit
from accyd.catalog.dtypes import DType
from accyd.catalog.model import ArtifactFormat
from accyd.errors import (
    DeviceFault,
    FailedPrecondition,
    LaunchArgumentMismatch,
    LaunchFailed,
    OutOfMemory,
    RuntimeUnavailable,
    UnsupportedOperation,
)
from accyd.memfd import sealed_memfd

__all__ = ["DEFAULT_MEMORY_SHARE", "HostBackend", "physical_memory"]

HostKernel = Callable[..., None]

DEFAULT_MEMORY_SHARE = 0.5
"""The share of physical memory the host backend hands out unless told another limit."""


def physical_memory() -> int:
    """This machine's physical memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class HostBackend:
    """Implements ``Backend`` on numpy in this process.

    Buffers are 256-byte aligned numpy byte arrays owned by the backend until
    ``destroy``. Each stream is a worker thread that runs its work in order;
    ``stream=None`` is a default stream the backend owns. ``close()`` stops
    every worker and drops every buffer, kernel, stream and event still held.
    Allocations past ``memory_limit`` bytes (default: ``DEFAULT_MEMORY_SHARE`` of
    physical memory) fail with ``OutOfMemory`` before any memory is touched.

    A kernel that raises ``DeviceFault`` poisons the backend as a sticky CUDA
    error poisons a context: every later call but the freeing ones raises
    ``DeviceFault``. That lets the daemon's fault handling run without a GPU.
    """

    def __init__(self, *, memory_limit: int | None = None) -> None:
        self._lock = threading.Lock()
        self._next_id = 1
        self._buffers: dict[int, DeviceBuffer] = {}
        self._memfds: dict[int, int] = {}
        """Exportable buffers' memfds, by buffer id (closed by ``destroy``)."""
        self._kernels: dict[int, LoadedKernel] = {}
        self._streams: dict[int, Worker] = {}
        self._events: dict[int, Event] = {}
        self._modules: dict[str, dict[str, Any]] = {}
        self._in_use = 0
        self._memory_limit = (
            int(physical_memory() * DEFAULT_MEMORY_SHARE) if memory_limit is None else memory_limit
        )
        self._default: Stream | None = None
        self._run_times = RunTimes()
        """Which kernels are short enough to run on the launching thread (``launch``)."""
        self._fault: DeviceFault | None = None
        self._closed = False
        self._staged = host_staged_copies(self._view, self._worker, self._alive)
        """Copies of shared memory (``pin_host``) go through the staging path GPUs use."""

    def _set_fault(self, fault: DeviceFault) -> None:
        with self._lock:
            if self._fault is None:
                self._fault = fault

    def _alive(self) -> None:
        fault = self._fault
        if fault is not None:
            raise DeviceFault(f"the device was lost earlier: {fault.message}")

    @property
    def kind(self) -> BackendKind:
        return BackendKind.HOST

    @property
    def prepared_takes_scalars(self) -> bool:
        return True  # ``SequentialLaunch`` keeps its requests: new values replace theirs

    @property
    def formats(self) -> frozenset[ArtifactFormat]:
        return frozenset({ArtifactFormat.HOST_PY})

    @property
    def device_name(self) -> str:
        return "host (numpy)"

    def _take_id(self) -> int:
        with self._lock:
            object_id = self._next_id
            self._next_id += 1
            return object_id

    def allocate_buffer(
        self,
        byte_size: int,
        *,
        alignment: int = BUFFER_ALIGNMENT,
        dtype: DType | None = None,
        element_count: int | None = None,
        zero: bool = False,
        exportable: bool = False,
    ) -> DeviceBuffer:
        self._alive()
        if byte_size <= 0:
            raise LaunchArgumentMismatch(f"a buffer needs at least 1 byte, not {byte_size}")
        if exportable and alignment > mmap.PAGESIZE:
            raise LaunchArgumentMismatch(f"an exportable buffer is page-aligned, not {alignment}")
        with self._lock:
            if self._in_use + byte_size > self._memory_limit:
                raise OutOfMemory(
                    f"host backend: {byte_size} bytes more would pass its memory limit of "
                    f"{self._memory_limit} bytes ({self._in_use} in use); free buffers, or "
                    "start the daemon with a larger --host-memory-limit"
                )
            self._in_use += byte_size
        memfd = None
        try:
            if exportable:  # in a memfd of its own (zero-filled), which export_buffer hands out
                memfd, mapping = sealed_memfd("accy-buffer", round_up(byte_size, mmap.PAGESIZE))
                data = np.frombuffer(mapping, dtype=np.uint8)[:byte_size]
            else:
                raw = np.empty(byte_size + alignment, dtype=np.uint8)
                skew = (-raw.ctypes.data) % alignment
                data = raw[skew : skew + byte_size]
                if zero:
                    data.fill(0)
        except (MemoryError, ValueError, OSError):  # ValueError: past numpy's largest array
            with self._lock:
                self._in_use -= byte_size
            raise OutOfMemory(f"host backend: cannot allocate {byte_size} bytes") from None
        buffer = DeviceBuffer(
            self._take_id(),
            BackendKind.HOST,
            byte_size,
            data.ctypes.data,
            dtype,
            element_count,
            data,
        )
        with self._lock:
            self._buffers[buffer.id] = buffer
            if memfd is not None:
                self._memfds[buffer.id] = memfd
        return buffer

    def export_buffer(self, buffer: DeviceBuffer) -> Exported:
        with self._lock:
            memfd = self._memfds.get(buffer.id)
            if memfd is None or self._buffers.get(buffer.id) is not buffer:
                raise FailedPrecondition(
                    f"buffer {buffer.id} was not allocated exportable", field="buffer_id"
                )
            fd = os.dup(memfd)
        return Exported(fd, ExportKind.HOST_MEMFD, os.fstat(fd).st_size, 0)

    def create_artifact(self, request: ArtifactRequest) -> CompiledArtifact:
        if request.format is not ArtifactFormat.HOST_PY:
            raise UnsupportedOperation(
                f"the host backend loads host_py kernels, not {request.format.value}"
            )
        if not isinstance(request.payload, str):
            raise RuntimeUnavailable(f"{request.origin}: a host_py payload must be Python source")
        digest = hashlib.sha256(request.payload.encode()).hexdigest()
        try:
            code = compile(request.payload, f"<{request.origin}>", "exec")
        except SyntaxError as error:
            raise RuntimeUnavailable(f"{request.origin}: {error}") from None
        return CompiledArtifact(request, (digest, code))

    def load_artifact(self, artifact: CompiledArtifact) -> LoadedKernel:
        self._alive()
        if artifact.closed:
            raise RuntimeUnavailable(f"{artifact.kernel_name}: the artifact is closed")
        digest, code = artifact.image
        assert isinstance(code, CodeType)
        with self._lock:
            namespace = self._modules.get(digest)
        if namespace is None:
            namespace = {"__name__": f"accy_host_kernels_{digest[:12]}"}
            try:
                exec(code, namespace)
            except Exception as error:
                raise RuntimeUnavailable(f"{artifact.origin}: {error}") from error
            with self._lock:
                self._modules[digest] = namespace
        function = namespace.get(artifact.kernel_name)
        if not callable(function):
            raise FailedPrecondition(
                f"{artifact.origin}: entry {artifact.kernel_name!r} names no function of the "
                "kernel's code; fix the catalog's manifest",
                field="entry",
            )
        kernel = LoadedKernel(self._take_id(), artifact.kernel_name, function)
        with self._lock:
            self._kernels[kernel.id] = kernel
        return kernel

    def _worker(self, stream: Stream | None) -> Worker:
        if stream is None:
            stream = self._default_stream()
        with self._lock:
            worker = self._streams.get(stream.id)
        if worker is None:
            raise LaunchArgumentMismatch(f"stream {stream.id} is not alive")
        return worker

    def _default_stream(self) -> Stream:
        with self._lock:
            default = self._default
        if default is None:
            default = self.create_stream()
            with self._lock:
                if self._default is None:
                    self._default = default
                else:  # another thread won the race
                    self._streams.pop(default.id).stop()
                    default = self._default
        return default

    def prepare(self, requests: Sequence[LaunchRequest]) -> PreparedLaunch:
        return SequentialLaunch(self, requests)

    def launch(self, request: LaunchRequest) -> None:
        self._alive()
        with self._lock:
            if request.loaded.id not in self._kernels:
                raise LaunchFailed(f"kernel {request.loaded.kernel_name} is not loaded")
            missing = [b.id for b in request.buffers if b.id not in self._buffers]
        if missing:
            raise LaunchFailed(f"buffers {missing} are not allocated")
        function: HostKernel = request.loaded.native
        geometry = request.geometry
        views = [buffer.native for buffer in request.buffers]
        values = [scalar.value for scalar in request.scalars]
        worker = self._worker(request.stream)
        key = (request.loaded.id, geometry, tuple(values))

        def run() -> None:
            if not worker.dropping:
                self._run_times.call(key, function, geometry.grid, geometry.block, views, values)

        worker.submit(run, here=self._run_times.short(key))

    def destroy(self, obj: DeviceBuffer | LoadedKernel) -> None:
        with self._lock:
            if isinstance(obj, DeviceBuffer):
                if self._buffers.pop(obj.id, None) is not None:
                    self._in_use -= obj.byte_size
                memfd = self._memfds.pop(obj.id, None)
                if memfd is not None:  # its mapping goes with the last array over it
                    os.close(memfd)
            else:
                self._kernels.pop(obj.id, None)

    def synchronize(self, stream: Stream | None = None) -> None:
        if stream is not None:
            self._worker(stream).synchronize()
        else:
            with self._lock:
                workers = list(self._streams.values())
            for worker in workers:
                worker.synchronize()
        self._alive()

    def create_stream(self, partition: str | None = None, priority: int = 0) -> Stream:
        self._alive()
        if partition is not None:
            raise UnsupportedOperation(f"the host backend has no SM partition {partition!r}")
        stream = Stream(self._take_id())
        worker = Worker(f"accy-host-stream-{stream.id}", self._set_fault)
        with self._lock:
            self._streams[stream.id] = worker
        return stream

    def split_sms(self, specs: Sequence[PartitionSpec]) -> SmSplit:
        return SmSplit(unconfined="the host backend runs kernels on CPU threads, not SMs")

    def destroy_stream(self, stream: Stream) -> None:
        with self._lock:
            worker = self._streams.pop(stream.id, None)
        if worker is not None:
            worker.stop()

    def record_event(self, stream: Stream | None) -> Event:
        self._alive()
        event = Event(self._take_id(), self._worker(stream).fence())
        with self._lock:
            self._events[event.id] = event
        return event

    def wait_event(self, stream: Stream | None, event: Event) -> None:
        fence: Fence = event.native

        def wait() -> None:
            fence.done.wait()

        self._worker(stream).submit(wait)

    def notify(self, stream: Stream | None, callback: Callable[[], None]) -> None:
        self._alive()
        self._worker(stream).submit(lambda: call_quietly(callback))

    def notify_event(
        self, event: Event, stream: Stream | None, callback: Callable[[], None]
    ) -> None:
        """Exactly when the work before ``event`` is over (the fence's own callback)."""
        fence: Fence = event.native
        fence.when_reached(callback)

    def drop_queued(self, stream: Stream) -> None:
        with self._lock:
            worker = self._streams.get(stream.id)
        if worker is not None:
            worker.dropping = True

    def event_done(self, event: Event) -> bool:
        fence: Fence = event.native
        return fence.done.is_set()

    def wait_event_for(self, event: Event, seconds: float) -> bool:
        fence: Fence = event.native
        return fence.done.wait(seconds)

    def synchronize_event(self, event: Event) -> None:
        """Wait for the work before ``event``; raise its error, once, as ``synchronize`` does."""
        fence: Fence = event.native
        fence.synchronize()
        self._alive()

    def destroy_event(self, event: Event) -> None:
        with self._lock:
            self._events.pop(event.id, None)

    def _view(self, buffer: DeviceBuffer, offset: int, size: int) -> npt.NDArray[np.uint8]:
        self._alive()
        with self._lock:
            live = buffer.id in self._buffers
        if not live:
            raise LaunchArgumentMismatch(f"buffer {buffer.id} is not allocated")
        if offset < 0 or size < 0 or offset + size > buffer.byte_size:
            raise LaunchArgumentMismatch(
                f"bytes {offset}..{offset + size} are outside the buffer's {buffer.byte_size}"
            )
        view: npt.NDArray[np.uint8] = buffer.native[offset : offset + size]
        return view

    def write(
        self, buffer: DeviceBuffer, offset: int, data: bytes | memoryview, stream: Stream | None
    ) -> None:
        if isinstance(data, memoryview) and self._staged.write(buffer, offset, data, stream):
            return
        source = np.frombuffer(data, dtype=np.uint8)
        target = self._view(buffer, offset, source.size)
        worker = self._worker(stream)
        worker.submit(lambda: np.copyto(target, source))
        worker.synchronize()

    def read(self, buffer: DeviceBuffer, offset: int, size: int, stream: Stream | None) -> bytes:
        source = self._view(buffer, offset, size)
        result: list[bytes] = []
        worker = self._worker(stream)
        worker.submit(lambda: result.append(source.tobytes()))
        worker.synchronize()
        return result[0]

    def read_into(
        self, buffer: DeviceBuffer, offset: int, out: bytearray | memoryview, stream: Stream | None
    ) -> None:
        view = memoryview(out)
        if view.readonly or not view.c_contiguous:
            raise LaunchArgumentMismatch("read_into needs a writable, C-contiguous buffer")
        if self._staged.read_into(buffer, offset, view, stream):
            return
        target = np.frombuffer(view.cast("B"), dtype=np.uint8)
        source = self._view(buffer, offset, target.size)
        worker = self._worker(stream)
        worker.submit(lambda: np.copyto(target, source))
        worker.synchronize()

    def pin_host(self, memory: memoryview, fd: int | None = None) -> object:
        """Nothing to lock on the host; its large copies take the staging path until due."""
        return self._staged.ranges.add(memoryview(memory).cast("B"))

    def unpin_host(self, pinned: object) -> None:
        self._staged.ranges.remove(pinned)

    def memory_in_use(self) -> int:
        with self._lock:
            return self._in_use

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            workers = list(self._streams.values())
            self._streams.clear()
            self._buffers.clear()
            memfds, self._memfds = list(self._memfds.values()), {}
            self._kernels.clear()
            self._events.clear()
            self._in_use = 0
        for worker in workers:
            worker.stop()
        self._staged.close()
        for memfd in memfds:
            os.close(memfd)
