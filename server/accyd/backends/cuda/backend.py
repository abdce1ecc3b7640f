"""The CUDA backend: one device's primary context, driven through cuda-python's driver API."""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

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
    Stream,
)
from accyd.backends.cuda.compile_cache import CompileCache
from accyd.backends.cuda.driver import ErrorCheck, check, cuda_driver
from accyd.backends.cuda.events import HOST_FN, Events
from accyd.backends.cuda.graphs import GraphLaunch
from accyd.backends.cuda.kernels import FEATURES, FORMATS, CudaKernel, Kernels
from accyd.backends.cuda.partitions import GreenContexts
from accyd.backends.cuda.shareable import Plain, Shareable, allocate_shareable
from accyd.backends.cuda.staging import cuda_staged_copies
from accyd.backends.cuda.state import CURRENT, TOKENS, DriverState
from accyd.backends.partitions import PartitionSpec, SmSplit
from accyd.catalog.dtypes import DType
from accyd.catalog.model import ArtifactFormat
from accyd.errors import (
    AccyError,
    FailedPrecondition,
    LaunchArgumentMismatch,
    LaunchFailed,
    OutOfMemory,
    RuntimeUnavailable,
    UnsupportedOperation,
)

__all__ = ["FEATURES", "CudaBackend"]


class CudaBackend(DriverState):
    """One CUDA device, through its primary context, for every caller in the process.

    Ownership: every buffer, loaded kernel (one module each), stream and event it hands
    out is tracked here until the caller frees it (``destroy``, ``destroy_stream``,
    ``destroy_event``); ``close`` frees whatever is left, then releases the primary
    context. ``CompiledArtifact`` images are plain bytes owned by the caller.

    Streams: work given ``stream=None`` goes to one backend-owned non-blocking stream,
    freed by ``close``; ``create_stream`` makes non-blocking streams, which never
    synchronize with the legacy default stream. ``write`` and ``read`` copy on the given
    stream and wait for it, so they are ordered after the work queued there before.

    Threads: calls may come from any thread; each thread makes the context current on
    its first call. A sticky device error (illegal address and the like) poisons the
    device for the process: every later call raises ``DeviceFault``.
    """

    def __init__(
        self,
        device_ordinal: int = 0,
        cache_dir: str | os.PathLike[str] | None = None,
        *,
        compile_cache: CompileCache | None = None,
    ) -> None:
        cu = cuda_driver()
        self._cu = cu
        self._kernel_calls = Kernels(self)
        self._stream_calls = Events(self)
        self.device_ordinal = device_ordinal
        self.cache = compile_cache if compile_cache is not None else CompileCache(cache_dir)
        self._check = ErrorCheck(device_ordinal, f"CUDA device {device_ordinal}")
        self._check.healthy()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._closed = False
        self._buffers: dict[int, DeviceBuffer] = {}
        self._kernels: dict[int, LoadedKernel] = {}
        self._streams: dict[int, Stream] = {}
        self._events: dict[int, Event] = {}
        self._event_pool: list[Any] = []
        self._bytes_in_use = 0
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._callback_ids = itertools.count(1)
        self._green = GreenContexts()
        # The driver calls this one C trampoline for every notify(); it must outlive
        # every host function still queued, so it lives as long as the backend.
        self._host_fn = HOST_FN(self._stream_calls.run_callback)
        self._host_fn_handle = cu.CUhostFn(ctypes.cast(self._host_fn, ctypes.c_void_p).value)
        try:
            check(cu.cuInit(0), "cuInit")
        except RuntimeError as error:  # cuda-python could not dlopen libcuda
            raise RuntimeUnavailable(f"the CUDA driver is not available: {error}") from None
        count = int(check(cu.cuDeviceGetCount(), "cuDeviceGetCount"))
        if not 0 <= device_ordinal < count:
            raise RuntimeUnavailable(f"no CUDA device {device_ordinal}; {count} present")
        self._device = check(cu.cuDeviceGet(device_ordinal), "cuDeviceGet")
        raw_name = check(cu.cuDeviceGetName(256, self._device), "cuDeviceGetName")
        self._name = bytes(raw_name).split(b"\0", 1)[0].decode(errors="replace").strip()
        attr = cu.CUdevice_attribute
        self.compute_capability: tuple[int, int] = (
            int(self._attribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)),
            int(self._attribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)),
        )
        self.multiprocessor_count = int(
            self._attribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        )
        self.driver_version = int(check(cu.cuDriverGetVersion(), "cuDriverGetVersion"))
        get_uuid = getattr(cu, "cuDeviceGetUuid_v2", None) or cu.cuDeviceGetUuid
        self.uuid = bytes(check(get_uuid(self._device), "cuDeviceGetUuid").bytes)
        """The GPU's UUID: ordinals differ between processes, this does not."""
        self._ctx = self._check(
            cu.cuDevicePrimaryCtxRetain(self._device), "cuDevicePrimaryCtxRetain"
        )
        self._ctx_key = next(TOKENS)
        try:
            self._make_current()
            self._default_stream = self._check(
                cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate"
            )
        except BaseException:
            cu.cuDevicePrimaryCtxRelease(self._device)
            raise
        self._staged, self._free_staging = cuda_staged_copies(
            self, self._register, self._unregister
        )

    # -- identity ----------------------------------------------------------------

    @property
    def context_handle(self) -> int:
        """The primary context's ``CUcontext`` as an integer, for a native engine's threads
        (which make it current before launching)."""
        return int(self._ctx)

    def driver_error(self, code: int, what: str) -> AccyError:
        """The domain error for a driver result a native engine met (sticky ones latched)."""
        return self._check.error(self._cu.CUresult(code), what, LaunchFailed)

    @property
    def kind(self) -> BackendKind:
        return BackendKind.CUDA

    @property
    def prepared_takes_scalars(self) -> bool:
        return True  # a graph is captured again and updated in place (``GraphLaunch``)

    @property
    def formats(self) -> frozenset[ArtifactFormat]:
        return FORMATS

    @property
    def device_name(self) -> str:
        return self._name

    @property
    def arch(self) -> str:
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"

    def _attribute(self, attribute: Any) -> int:
        return int(
            check(self._cu.cuDeviceGetAttribute(attribute, self._device), "cuDeviceGetAttribute")
        )

    # -- context and state ---------------------------------------------------------

    def device_memory_info(self) -> tuple[int, int]:
        """(free, total) bytes of device memory, as cuMemGetInfo reports them."""
        self._enter()
        free, total = self._check(self._cu.cuMemGetInfo(), "cuMemGetInfo")
        return int(free), int(total)

    def pin_host(self, memory: memoryview, fd: int | None = None) -> object:
        """Record ``memory`` as shared: its large copies are staged through the page-locked
        slots until it earned locking, then it is ``cuMemHostRegister``'d in the background
        (``accyd.backends.shared_ranges``). ``fd`` is not needed in-process (ignored)."""
        return self._staged.ranges.add(memoryview(memory).cast("B"))

    def unpin_host(self, pinned: object) -> None:
        self._staged.ranges.remove(pinned)

    def _register(self, memory: memoryview) -> object:
        """``cuMemHostRegister`` (portable) on ``memory``; the anchor keeps it exported."""
        self._enter()
        anchor = (ctypes.c_char * memory.nbytes).from_buffer(memory)
        self._check(
            self._cu.cuMemHostRegister(
                ctypes.addressof(anchor),
                memory.nbytes,
                self._cu.CU_MEMHOSTREGISTER_PORTABLE,
            ),
            "cuMemHostRegister",
            OutOfMemory,
        )
        return anchor

    def _unregister(self, anchor: object) -> None:
        if isinstance(anchor, ctypes.Array):
            self._enter()
            self._check(
                self._cu.cuMemHostUnregister(ctypes.addressof(anchor)), "cuMemHostUnregister"
            )

    def memory_in_use(self) -> int:
        return self._bytes_in_use

    @property
    def fault(self) -> str | None:
        """The sticky error that poisoned this device, if one did."""
        return self._check.fault

    # -- buffers ---------------------------------------------------------------------

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
        self._enter()
        if byte_size <= 0:
            raise LaunchArgumentMismatch(f"a buffer needs a positive size, got {byte_size}")
        if alignment <= 0 or alignment & (alignment - 1):
            raise LaunchArgumentMismatch(f"alignment must be a power of two, got {alignment}")
        cu = self._cu
        native: Plain | Shareable
        if exportable:  # VMM memory starts at a granule: aligned far past any request
            native = allocate_shareable(cu, self._check, self.device_ordinal, byte_size)
            address = native.base
        else:
            extra = alignment if alignment > BUFFER_ALIGNMENT else 0
            native = Plain(
                int(self._check(cu.cuMemAlloc(byte_size + extra), "cuMemAlloc", OutOfMemory))
            )
            address = (native.base + alignment - 1) & ~(alignment - 1) if extra else native.base
        if address % max(alignment, BUFFER_ALIGNMENT):
            native.free(cu)
            raise RuntimeUnavailable(f"the driver gave {address:#x}, not {alignment}-byte aligned")
        if zero:
            try:
                self._check(
                    cu.cuMemsetD8Async(address, 0, byte_size, self._default_stream),
                    "cuMemsetD8Async",
                )
                self._check(cu.cuStreamSynchronize(self._default_stream), "cuStreamSynchronize")
            except BaseException:
                native.free(cu)
                raise
        buffer = DeviceBuffer(
            id=next(self._ids),
            backend=BackendKind.CUDA,
            byte_size=byte_size,
            address=address,
            dtype=dtype,
            element_count=element_count,
            native=native,
        )
        with self._lock:
            self._buffers[buffer.id] = buffer
            self._bytes_in_use += byte_size
        return buffer

    def export_buffer(self, buffer: DeviceBuffer) -> Exported:
        self._enter()
        with self._lock:
            live = self._buffers.get(buffer.id) is buffer
        native = buffer.native
        if not live or not isinstance(native, Shareable):
            raise FailedPrecondition(
                f"buffer {buffer.id} was not allocated exportable", field="buffer_id"
            )
        fd = native.export()
        offset = buffer.address - native.base
        return Exported(fd, ExportKind.CUDA_VMM, native.size, offset, self.uuid)

    def destroy(self, obj: DeviceBuffer | LoadedKernel) -> None:
        """Free a buffer or unload a kernel; a second destroy of the same handle does nothing."""
        if self._closed:
            return
        if isinstance(obj, DeviceBuffer):
            if obj.backend is not BackendKind.CUDA:
                raise UnsupportedOperation(
                    f"buffer {obj.id} belongs to the {obj.backend.value} backend"
                )
            with self._lock:
                if self._buffers.get(obj.id) is not obj:
                    return
                del self._buffers[obj.id]
                self._bytes_in_use -= obj.byte_size
            self._free_native(lambda: obj.native.free(self._cu), "freeing a buffer")
        elif isinstance(obj, LoadedKernel):
            with self._lock:
                if self._kernels.get(obj.id) is not obj:
                    return
                del self._kernels[obj.id]
            kernel: CudaKernel = obj.native
            with kernel.lock:
                kernel.live = False
            self._free_native(lambda: self._cu.cuModuleUnload(kernel.module), "cuModuleUnload")
        else:
            raise UnsupportedOperation(f"cannot destroy {type(obj).__name__}")

    # -- kernels (``Kernels``: compile, load, launch) ------------------------------------

    def create_artifact(self, request: ArtifactRequest) -> CompiledArtifact:
        return self._kernel_calls.create_artifact(request)

    def load_artifact(self, artifact: CompiledArtifact) -> LoadedKernel:
        return self._kernel_calls.load_artifact(artifact)

    def launch(self, request: LaunchRequest) -> None:
        self._kernel_calls.launch(request)

    # -- streams and events (``Events``) -------------------------------------------------

    def synchronize(self, stream: Stream | None = None) -> None:
        self._stream_calls.synchronize(stream)

    def create_stream(self, partition: str | None = None, priority: int = 0) -> Stream:
        return self._stream_calls.create_stream(partition, priority)

    def split_sms(self, specs: Sequence[PartitionSpec]) -> SmSplit:
        return self._stream_calls.split_sms(specs)

    def destroy_stream(self, stream: Stream) -> None:
        self._stream_calls.destroy_stream(stream)

    def record_event(self, stream: Stream | None) -> Event:
        return self._stream_calls.record_event(stream)

    def wait_event(self, stream: Stream | None, event: Event) -> None:
        self._stream_calls.wait_event(stream, event)

    def notify(self, stream: Stream | None, callback: Callable[[], None]) -> None:
        self._stream_calls.notify(stream, callback)

    def notify_event(
        self, event: Event, stream: Stream | None, callback: Callable[[], None]
    ) -> None:
        self._stream_calls.notify_event(event, stream, callback)

    def drop_queued(self, stream: Stream) -> None:
        self._stream_calls.drop_queued(stream)

    def event_done(self, event: Event) -> bool:
        return self._stream_calls.event_done(event)

    def wait_event_for(self, event: Event, seconds: float) -> bool:
        return self._stream_calls.wait_event_for(event, seconds)

    def synchronize_event(self, event: Event) -> None:
        self._stream_calls.synchronize_event(event)

    def destroy_event(self, event: Event) -> None:
        self._stream_calls.destroy_event(event)

    # -- copies ------------------------------------------------------------------------

    def _bounds(self, buffer: DeviceBuffer, offset: int, size: int) -> None:
        if offset < 0 or size < 0 or offset + size > buffer.byte_size:
            raise LaunchArgumentMismatch(
                f"bytes [{offset}, {offset + size}) are outside buffer {buffer.id} "
                f"of {buffer.byte_size} bytes"
            )

    def write(
        self, buffer: DeviceBuffer, offset: int, data: bytes | memoryview, stream: Stream | None
    ) -> None:
        self._enter()
        view = memoryview(data)
        if not view.c_contiguous:
            view = memoryview(view.tobytes())
        size = view.nbytes
        self._live_buffer(buffer)
        self._bounds(buffer, offset, size)
        if size == 0:
            return
        if self._staged.write(buffer, offset, view, stream):
            return
        handle = self._stream_handle(stream)
        cu = self._cu
        self._check(
            cu.cuMemcpyHtoDAsync(buffer.address + offset, view, size, handle),
            "cuMemcpyHtoDAsync",
            LaunchFailed,
        )
        self._check(cu.cuStreamSynchronize(handle), "cuStreamSynchronize", LaunchFailed)

    def read(self, buffer: DeviceBuffer, offset: int, size: int, stream: Stream | None) -> bytes:
        out = bytearray(size)
        self.read_into(buffer, offset, out, stream)
        return bytes(out)

    def read_into(
        self,
        buffer: DeviceBuffer,
        offset: int,
        out: bytearray | memoryview | Any,
        stream: Stream | None,
    ) -> None:
        """Copy ``len(out)`` bytes of ``buffer`` from ``offset`` into the writable ``out``
        (any C-contiguous buffer, such as a numpy array), in ``stream``'s order."""
        self._enter()
        view = memoryview(out)
        if view.readonly or not view.c_contiguous:
            raise LaunchArgumentMismatch("read_into needs a writable, C-contiguous buffer")
        size = view.nbytes
        self._live_buffer(buffer)
        self._bounds(buffer, offset, size)
        if size == 0:
            return
        if self._staged.read_into(buffer, offset, view.cast("B"), stream):
            return
        handle = self._stream_handle(stream)
        cu = self._cu
        self._check(
            cu.cuMemcpyDtoHAsync(view, buffer.address + offset, size, handle),
            "cuMemcpyDtoHAsync",
            LaunchFailed,
        )
        self._check(cu.cuStreamSynchronize(handle), "cuStreamSynchronize", LaunchFailed)

    # -- prepared launches ---------------------------------------------------------------

    def prepare(self, requests: Sequence[LaunchRequest]) -> PreparedLaunch:
        """The requests captured as one graph (``GraphLaunch``), replayed by one call."""
        self._enter()
        return GraphLaunch(self, requests)

    # -- teardown ------------------------------------------------------------------------------

    def close(self) -> None:
        """Wait for the device (unless poisoned), free every tracked object, release the context."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            buffers = list(self._buffers.values())
            kernels = list(self._kernels.values())
            events = [e.native for e in self._events.values()] + self._event_pool
            streams = [s.native for s in self._streams.values()]
            self._buffers.clear()
            self._kernels.clear()
            self._events.clear()
            self._event_pool = []
            self._streams.clear()
            self._bytes_in_use = 0
        cu = self._cu
        self._staged.close()
        # Best effort throughout: a poisoned context refuses these calls, which frees nothing
        # more but must not stop the rest of the teardown.
        cu.cuCtxSetCurrent(self._ctx)
        CURRENT.ctx = self._ctx_key
        if self._check.fault is None:
            cu.cuCtxSynchronize()
        self._free_staging()
        for buffer in buffers:
            buffer.native.free(cu)
        for loaded in kernels:
            loaded.native.live = False
            cu.cuModuleUnload(loaded.native.module)
        for native in events:
            cu.cuEventDestroy(native)
        for native in [*streams, self._default_stream]:
            cu.cuStreamDestroy(native)
        self._green.close(cu)
        cu.cuDevicePrimaryCtxRelease(self._device)
        CURRENT.ctx = None

    def __enter__(self) -> CudaBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("faulted" if self._check.fault else "open")
        return f"CudaBackend(device {self.device_ordinal}: {self._name}, {self.arch}, {state})"


if TYPE_CHECKING:
    from accyd.backends.base import Backend

    _conforms: type[Backend] = CudaBackend
