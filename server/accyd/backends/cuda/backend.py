"""The CUDA backend: one device's primary context, driven through cuda-python's driver API."""

from __future__ import annotations

import ctypes
import itertools
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from accyd.backends.base import (
    BUFFER_ALIGNMENT,
    ArtifactRequest,
    BackendKind,
    CompiledArtifact,
    DeviceBuffer,
    Event,
    LaunchRequest,
    LoadedKernel,
    PreparedLaunch,
    Stream,
)
from accyd.backends.cuda.compile_cache import CompileCache, KernelImage
from accyd.backends.cuda.driver import DEVICE_FAULTS, ErrorCheck, check, cuda_driver
from accyd.backends.cuda.graphs import GraphLaunch
from accyd.catalog.dtypes import DType, Scalar
from accyd.catalog.model import ArtifactFormat
from accyd.errors import (
    FailedPrecondition,
    InvalidArtifact,
    LaunchArgumentMismatch,
    LaunchFailed,
    OutOfMemory,
    RuntimeUnavailable,
    Unavailable,
    UnsupportedOperation,
)

__all__ = ["FEATURES", "CudaBackend"]

_FORMATS = frozenset({ArtifactFormat.CUDA_CPP, ArtifactFormat.CUDA_PTX, ArtifactFormat.CUDA_CUBIN})

FEATURES = frozenset({"fp64", "atomics", "warp_shuffle", "dynamic_shared_memory"})
"""The ``required_features`` names this backend satisfies."""

_SLOT = 8  # every kernel argument gets an 8-byte slot in the packed argument block

_SCALAR_PACK: dict[DType, Callable[[Any, int, Any], None]] = {
    DType.U32: struct.Struct("<I").pack_into,
    DType.I32: struct.Struct("<i").pack_into,
    DType.F32: struct.Struct("<f").pack_into,
    DType.U64: struct.Struct("<Q").pack_into,
    DType.I64: struct.Struct("<q").pack_into,
    DType.F64: struct.Struct("<d").pack_into,
    DType.U8: struct.Struct("<B").pack_into,
}
"""Each scalar dtype's packer into its 8-byte argument slot (little-endian)."""

_EVENT_POOL_MAX = 256

# The context each thread last made current (cuCtxSetCurrent is per thread); shared by
# every backend object so that two devices used from one thread switch correctly.
_CURRENT = threading.local()
# Each backend object gets its own token, so a thread re-binds after a context was released
# and retained again by a new backend object (the handle value may repeat).
_TOKENS = itertools.count(1)


@dataclass(frozen=True, slots=True)
class _Image:
    """``CompiledArtifact.image`` for CUDA: a module image plus what it takes to rebuild it."""

    kind: str  # "cubin" | "ptx"
    data: bytes
    cache_key: str | None = None
    source: str | None = None
    name: str = "kernel.cu"


class _Kernel:
    """``LoadedKernel.native``: the module, the function, and its reusable argument block.

    ``storage`` holds one 8-byte slot per argument and ``params`` the pointers to them,
    built once at load; a launch packs values into the slots under ``lock`` and passes
    the address of ``params`` to cuLaunchKernel, which copies the values at enqueue.
    """

    __slots__ = (
        "buffer_count",
        "dynamic_shared_limit",
        "function",
        "live",
        "lock",
        "module",
        "name",
        "pack_buffers",
        "params",
        "params_address",
        "scalar_count",
        "scalar_offset",
        "storage",
    )

    def __init__(self, name: str, module: Any, function: Any, buffers: int, scalars: int) -> None:
        self.name = name
        self.module = module
        self.function = function
        self.buffer_count = buffers
        self.scalar_count = scalars
        slots = max(1, buffers + scalars)
        self.storage = (ctypes.c_uint64 * slots)()
        base = ctypes.addressof(self.storage)
        self.params = (ctypes.c_void_p * slots)(*(base + _SLOT * i for i in range(slots)))
        self.params_address = ctypes.addressof(self.params)
        self.pack_buffers = struct.Struct(f"<{buffers}Q").pack_into
        self.scalar_offset = buffers * _SLOT
        self.lock = threading.Lock()
        self.live = True
        self.dynamic_shared_limit = 0


class _Allocation:
    """``DeviceBuffer.native``: the pointer cuMemAlloc returned (the buffer may start past it)."""

    __slots__ = ("base",)

    def __init__(self, base: int) -> None:
        self.base = base


_HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
"""The C signature of a CUhostFn: ``void fn(void* user_data)``."""


def _log_callback_error() -> None:
    logging.getLogger(__name__).exception("a stream notification callback failed")


class CudaBackend:
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
        # The driver calls this one C trampoline for every notify(); it must outlive
        # every host function still queued, so it lives as long as the backend.
        self._host_fn = _HOST_FN(self._run_callback)
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
        self._ctx = self._check(
            cu.cuDevicePrimaryCtxRetain(self._device), "cuDevicePrimaryCtxRetain"
        )
        self._ctx_key = next(_TOKENS)
        try:
            self._make_current()
            self._default_stream = self._check(
                cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate"
            )
        except BaseException:
            cu.cuDevicePrimaryCtxRelease(self._device)
            raise

    # -- identity ----------------------------------------------------------------

    @property
    def kind(self) -> BackendKind:
        return BackendKind.CUDA

    @property
    def formats(self) -> frozenset[ArtifactFormat]:
        return _FORMATS

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

    def _make_current(self) -> None:
        self._check(self._cu.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
        _CURRENT.ctx = self._ctx_key

    def _enter(self) -> None:
        """Refuse a closed or poisoned backend; make the context current on this thread."""
        if self._closed:
            raise Unavailable(f"the CUDA backend of device {self.device_ordinal} is closed")
        self._check.healthy()
        if getattr(_CURRENT, "ctx", None) != self._ctx_key:
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

    def device_memory_info(self) -> tuple[int, int]:
        """(free, total) bytes of device memory, as cuMemGetInfo reports them."""
        self._enter()
        free, total = self._check(self._cu.cuMemGetInfo(), "cuMemGetInfo")
        return int(free), int(total)

    def pin_host(self, memory: memoryview) -> object:
        """``cuMemHostRegister`` (portable) on ``memory``; the returned anchor keeps it exported."""
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

    def unpin_host(self, pinned: object) -> None:
        if isinstance(pinned, ctypes.Array):
            self._enter()
            self._check(
                self._cu.cuMemHostUnregister(ctypes.addressof(pinned)), "cuMemHostUnregister"
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
    ) -> DeviceBuffer:
        self._enter()
        if byte_size <= 0:
            raise LaunchArgumentMismatch(f"a buffer needs a positive size, got {byte_size}")
        if alignment <= 0 or alignment & (alignment - 1):
            raise LaunchArgumentMismatch(f"alignment must be a power of two, got {alignment}")
        cu = self._cu
        extra = alignment if alignment > BUFFER_ALIGNMENT else 0
        base = int(self._check(cu.cuMemAlloc(byte_size + extra), "cuMemAlloc", OutOfMemory))
        address = (base + alignment - 1) & ~(alignment - 1) if extra else base
        if address % max(alignment, BUFFER_ALIGNMENT):
            cu.cuMemFree(base)
            raise RuntimeUnavailable(f"cuMemAlloc returned {base:#x}, not {alignment}-byte aligned")
        if zero:
            try:
                self._check(
                    cu.cuMemsetD8Async(address, 0, byte_size, self._default_stream),
                    "cuMemsetD8Async",
                )
                self._check(cu.cuStreamSynchronize(self._default_stream), "cuStreamSynchronize")
            except BaseException:
                cu.cuMemFree(base)
                raise
        buffer = DeviceBuffer(
            id=next(self._ids),
            backend=BackendKind.CUDA,
            byte_size=byte_size,
            address=address,
            dtype=dtype,
            element_count=element_count,
            native=_Allocation(base),
        )
        with self._lock:
            self._buffers[buffer.id] = buffer
            self._bytes_in_use += byte_size
        return buffer

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
            self._free_native(lambda: self._cu.cuMemFree(obj.native.base), "cuMemFree")
        elif isinstance(obj, LoadedKernel):
            with self._lock:
                if self._kernels.get(obj.id) is not obj:
                    return
                del self._kernels[obj.id]
            kernel: _Kernel = obj.native
            with kernel.lock:
                kernel.live = False
            self._free_native(lambda: self._cu.cuModuleUnload(kernel.module), "cuModuleUnload")
        else:
            raise UnsupportedOperation(f"cannot destroy {type(obj).__name__}")

    def _free_native(self, call: Callable[[], Any], what: str) -> None:
        """Run a freeing call; after a fault the driver refuses it, which changes nothing."""
        if self._check.fault is not None:
            call()
            return
        if getattr(_CURRENT, "ctx", None) != self._ctx_key:
            self._make_current()
        self._check(call(), what, LaunchFailed)

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
        handle = self._stream_handle(stream)
        cu = self._cu
        self._check(
            cu.cuMemcpyDtoHAsync(view, buffer.address + offset, size, handle),
            "cuMemcpyDtoHAsync",
            LaunchFailed,
        )
        self._check(cu.cuStreamSynchronize(handle), "cuStreamSynchronize", LaunchFailed)

    # -- artifacts -------------------------------------------------------------------------

    def create_artifact(self, request: ArtifactRequest) -> CompiledArtifact:
        """Compile (CUDA C++, through the disk cache) or take (PTX, cubin) a kernel image.

        Needs no context: compiles may run on worker threads.
        """
        if self._closed:
            raise Unavailable(f"the CUDA backend of device {self.device_ordinal} is closed")
        if request.format not in _FORMATS:
            raise UnsupportedOperation(f"the CUDA backend does not load {request.format.value}")
        if not 0 <= request.scalar_argument_count <= request.argument_count:
            raise InvalidArtifact(
                f"{request.kernel_name}: {request.scalar_argument_count} scalar arguments "
                f"of {request.argument_count}"
            )
        missing = set(request.required_features) - FEATURES
        if missing:
            raise UnsupportedOperation(
                f"{request.kernel_name} needs features the CUDA backend lacks: {sorted(missing)}"
            )
        payload = request.payload
        if request.format is ArtifactFormat.CUDA_CPP:
            source = payload.decode() if isinstance(payload, bytes) else payload
            name = os.path.basename(request.origin) or "kernel.cu"
            compiled = self.cache.compile(source, arch=self.compute_capability, name=name)
            image = _Image(compiled.kind, compiled.data, compiled.key, source, name)
        elif request.format is ArtifactFormat.CUDA_PTX:
            text = payload if isinstance(payload, bytes) else payload.encode()
            image = _Image("ptx", text.rstrip(b"\0"))
        else:
            if not isinstance(payload, bytes):
                raise InvalidArtifact(f"{request.kernel_name}: a cuda_cubin payload must be bytes")
            image = _Image("cubin", payload)
        return CompiledArtifact(request, image)

    def load_artifact(self, artifact: CompiledArtifact) -> LoadedKernel:
        """Load the image as its own module and find the kernel's symbol."""
        self._enter()
        image = artifact.image
        if artifact.closed or not isinstance(image, _Image):
            raise InvalidArtifact(
                f"{artifact.kernel_name}: the artifact is closed or not a CUDA image"
            )
        try:
            module = self._load_module(image, artifact.kernel_name)
        except RuntimeUnavailable:
            if image.cache_key is None or image.source is None:
                raise
            # A cached image the driver refuses: drop it and compile afresh, once.
            self.cache.invalidate(image.cache_key)
            fresh: KernelImage = self.cache.compile(
                image.source, arch=self.compute_capability, name=image.name, use_cache=False
            )
            image = _Image(fresh.kind, fresh.data, fresh.key, image.source, image.name)
            artifact.image = image
            module = self._load_module(image, artifact.kernel_name)
        cu = self._cu
        try:
            function = self._check(
                cu.cuModuleGetFunction(module, artifact.kernel_name.encode()),
                f"entry {artifact.kernel_name!r} (cuModuleGetFunction) in {artifact.origin}",
                FailedPrecondition,  # the manifest names no kernel of its code: not retryable
            )
        except BaseException:
            cu.cuModuleUnload(module)
            raise
        kernel = _Kernel(
            artifact.kernel_name,
            module,
            function,
            artifact.buffer_argument_count(),
            artifact.scalar_argument_count,
        )
        loaded = LoadedKernel(id=next(self._ids), kernel_name=artifact.kernel_name, native=kernel)
        with self._lock:
            self._kernels[loaded.id] = loaded
        return loaded

    def _load_module(self, image: _Image, kernel_name: str) -> Any:
        data = image.data + b"\0" if image.kind == "ptx" else image.data
        return self._check(
            self._cu.cuModuleLoadData(data), f"cuModuleLoadData ({image.kind}) for {kernel_name}"
        )

    # -- launches ------------------------------------------------------------------------------

    def prepare(self, requests: Sequence[LaunchRequest]) -> PreparedLaunch:
        """The requests captured as one graph (``GraphLaunch``), replayed by one call."""
        self._enter()
        return GraphLaunch(self, requests)

    def launch(self, request: LaunchRequest) -> None:
        """Enqueue one kernel on the request's stream; returns without waiting.

        Buffers are passed as device pointers, then each scalar at its own dtype's size.
        """
        if self._closed or DEVICE_FAULTS:
            self._enter()  # raises the reason
        if getattr(_CURRENT, "ctx", None) != self._ctx_key:
            self._make_current()
        loaded = request.loaded
        kernel = loaded.native
        if self._kernels.get(loaded.id) is not loaded:
            raise InvalidArtifact(f"kernel {loaded.kernel_name!r} is not loaded on this backend")
        buffers = request.buffers
        scalars = request.scalars
        live = self._buffers
        addresses = [b.address for b in buffers if live.get(b.id) is b]
        if (
            len(addresses) != len(buffers)
            or len(buffers) != kernel.buffer_count
            or len(scalars) != kernel.scalar_count
        ):
            raise self._argument_mismatch(kernel, buffers, scalars)
        stream = request.stream
        if stream is None:
            handle = self._default_stream
        elif self._streams.get(stream.id) is stream:
            handle = stream.native
        else:
            raise LaunchArgumentMismatch(f"stream {stream.id} is not a live stream of this backend")
        gx, gy, gz = request.geometry.grid
        bx, by, bz = request.geometry.block
        shared = request.shared_memory_bytes
        with kernel.lock:
            storage = kernel.storage
            kernel.pack_buffers(storage, 0, *addresses)
            offset = kernel.scalar_offset
            for scalar in scalars:
                _SCALAR_PACK[scalar.dtype](storage, offset, scalar.value)
                offset += _SLOT
            if shared > kernel.dynamic_shared_limit:
                self._raise_shared_limit(kernel, shared)
            err = self._cu.cuLaunchKernel(
                kernel.function,
                gx,
                gy,
                gz,
                bx,
                by,
                bz,
                shared,
                handle,
                kernel.params_address,
                0,
            )[0]
        if err:
            raise self._check.error(
                err,
                f"cuLaunchKernel({kernel.name}, grid={(gx, gy, gz)}, block={(bx, by, bz)}, "
                f"shared={shared})",
                LaunchFailed,
            )

    def _argument_mismatch(
        self, kernel: _Kernel, buffers: Sequence[DeviceBuffer], scalars: Sequence[Scalar]
    ) -> LaunchArgumentMismatch:
        for buffer in buffers:
            if self._buffers.get(buffer.id) is not buffer:
                return LaunchArgumentMismatch(
                    f"{kernel.name}: buffer {buffer.id} is not a live buffer of this backend"
                )
        return LaunchArgumentMismatch(
            f"{kernel.name} takes {kernel.buffer_count} buffers and {kernel.scalar_count} "
            f"scalars; got {len(buffers)} and {len(scalars)}"
        )

    def _raise_shared_limit(self, kernel: _Kernel, shared: int) -> None:
        cu = self._cu
        attribute = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        self._check(
            cu.cuFuncSetAttribute(kernel.function, attribute, shared),
            f"cuFuncSetAttribute({kernel.name}, dynamic shared memory {shared})",
            LaunchFailed,
        )
        kernel.dynamic_shared_limit = shared

    # -- streams, events, synchronization ------------------------------------------------------

    def synchronize(self, stream: Stream | None = None) -> None:
        """Wait for ``stream``'s work; ``None`` waits for the whole device (cuCtxSynchronize)."""
        self._enter()
        if stream is None:
            self._check(self._cu.cuCtxSynchronize(), "cuCtxSynchronize", LaunchFailed)
        else:
            self._check(
                self._cu.cuStreamSynchronize(self._stream_handle(stream)),
                "cuStreamSynchronize",
                LaunchFailed,
            )

    def create_stream(self) -> Stream:
        self._enter()
        cu = self._cu
        handle = self._check(
            cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate"
        )
        stream = Stream(id=next(self._ids), native=handle)
        with self._lock:
            self._streams[stream.id] = stream
        return stream

    def destroy_stream(self, stream: Stream) -> None:
        """Destroy a stream; work already queued on it still completes (CUDA's rule)."""
        if self._closed:
            return
        with self._lock:
            if self._streams.get(stream.id) is not stream:
                return
            del self._streams[stream.id]
        self._free_native(lambda: self._cu.cuStreamDestroy(stream.native), "cuStreamDestroy")

    def record_event(self, stream: Stream | None) -> Event:
        self._enter()
        cu = self._cu
        handle = self._stream_handle(stream)
        with self._lock:
            native = self._event_pool.pop() if self._event_pool else None
        if native is None:
            native = self._check(
                cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate"
            )
        try:
            self._check(cu.cuEventRecord(native, handle), "cuEventRecord", LaunchFailed)
        except BaseException:
            cu.cuEventDestroy(native)
            raise
        event = Event(id=next(self._ids), native=native)
        with self._lock:
            self._events[event.id] = event
        return event

    def _live_event(self, event: Event) -> Any:
        if self._events.get(event.id) is not event:
            raise LaunchArgumentMismatch(f"event {event.id} is not a live event of this backend")
        return event.native

    def wait_event(self, stream: Stream | None, event: Event) -> None:
        self._enter()
        self._check(
            self._cu.cuStreamWaitEvent(self._stream_handle(stream), self._live_event(event), 0),
            "cuStreamWaitEvent",
            LaunchFailed,
        )

    def notify(self, stream: Stream | None, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the driver's host-function thread after the stream's work."""
        self._enter()
        key = next(self._callback_ids)
        with self._lock:
            self._callbacks[key] = callback
        try:
            self._check(
                self._cu.cuLaunchHostFunc(self._stream_handle(stream), self._host_fn_handle, key),
                "cuLaunchHostFunc",
                LaunchFailed,
            )
        except BaseException:
            with self._lock:
                self._callbacks.pop(key, None)
            raise

    def notify_event(
        self, event: Event, stream: Stream | None, callback: Callable[[], None]
    ) -> None:
        """After the stream's work so far (which includes ``event``): a host function."""
        self.notify(stream, callback)

    def drop_queued(self, stream: Stream) -> None:
        """Nothing: what was enqueued belongs to the driver and runs."""

    def _run_callback(self, user_data: int | None) -> None:
        with self._lock:
            callback = self._callbacks.pop(user_data or 0, None)
        if callback is not None:
            try:
                callback()
            except Exception:  # nothing may escape into the driver's thread
                _log_callback_error()

    def event_done(self, event: Event) -> bool:
        self._enter()
        cu = self._cu
        (err,) = cu.cuEventQuery(self._live_event(event))
        if not err:
            return True
        if err == cu.CUresult.CUDA_ERROR_NOT_READY:
            return False
        raise self._check.error(err, "cuEventQuery", LaunchFailed)

    def wait_event_for(self, event: Event, seconds: float) -> bool:
        """Poll the event (the GIL is let go in each query) for at most ``seconds``."""
        self._enter()
        query, native = self._cu.cuEventQuery, self._live_event(event)
        not_ready = self._cu.CUresult.CUDA_ERROR_NOT_READY
        deadline = time.perf_counter() + seconds
        while True:
            (err,) = query(native)
            if err != not_ready:
                return True  # finished, or failed: the full wait reports which
            if time.perf_counter() >= deadline:
                return False

    def synchronize_event(self, event: Event) -> None:
        self._enter()
        self._check(
            self._cu.cuEventSynchronize(self._live_event(event)), "cuEventSynchronize", LaunchFailed
        )

    def destroy_event(self, event: Event) -> None:
        if self._closed:
            return
        with self._lock:
            if self._events.get(event.id) is not event:
                return
            del self._events[event.id]
            if len(self._event_pool) < _EVENT_POOL_MAX and self._check.fault is None:
                # Re-recording an event is allowed while earlier records are pending.
                self._event_pool.append(event.native)
                return
        self._free_native(lambda: self._cu.cuEventDestroy(event.native), "cuEventDestroy")

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
        # Best effort throughout: a poisoned context refuses these calls, which frees nothing
        # more but must not stop the rest of the teardown.
        cu.cuCtxSetCurrent(self._ctx)
        _CURRENT.ctx = self._ctx_key
        if self._check.fault is None:
            cu.cuCtxSynchronize()
        for buffer in buffers:
            cu.cuMemFree(buffer.native.base)
        for loaded in kernels:
            loaded.native.live = False
            cu.cuModuleUnload(loaded.native.module)
        for native in events:
            cu.cuEventDestroy(native)
        for native in [*streams, self._default_stream]:
            cu.cuStreamDestroy(native)
        cu.cuDevicePrimaryCtxRelease(self._device)
        _CURRENT.ctx = None

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
