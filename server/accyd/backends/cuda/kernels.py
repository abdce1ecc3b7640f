"""The CUDA backend's kernels: compile or take images, load modules, launch, prepare graphs."""

from __future__ import annotations

import ctypes
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from accyd.backends.base import (
    ArtifactRequest,
    CompiledArtifact,
    DeviceBuffer,
    LaunchRequest,
    LoadedKernel,
)
from accyd.backends.cuda.compile_cache import KernelImage
from accyd.backends.cuda.driver import DEVICE_FAULTS
from accyd.backends.cuda.params import check_parameters
from accyd.backends.cuda.state import CURRENT, DriverState
from accyd.catalog.dtypes import DType, Scalar
from accyd.catalog.model import ArtifactFormat, Param, ParamKind
from accyd.errors import (
    FailedPrecondition,
    InvalidArtifact,
    LaunchArgumentMismatch,
    LaunchFailed,
    RuntimeUnavailable,
    Unavailable,
    UnsupportedOperation,
)

__all__ = ["FEATURES", "FORMATS", "CudaKernel", "Kernels"]

FORMATS = frozenset(
    {
        ArtifactFormat.CUDA_CPP,
        ArtifactFormat.CUDA_PTX,
        ArtifactFormat.CUDA_CUBIN,
        ArtifactFormat.TRITON,
    }
)

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
    DType.F16: struct.Struct("<e").pack_into,
    DType.I8: struct.Struct("<b").pack_into,
    DType.I16: struct.Struct("<h").pack_into,
    DType.U16: struct.Struct("<H").pack_into,
}
"""Each scalar dtype's packer into its 8-byte argument slot (little-endian)."""


@dataclass(frozen=True, slots=True)
class _Image:
    """``CompiledArtifact.image`` for CUDA: a module image plus what it takes to rebuild it."""

    kind: str  # "cubin" | "ptx"
    data: bytes
    cache_key: str | None = None
    source: str | None = None
    name: str = "kernel.cu"
    symbol: str = ""
    """The kernel's symbol in the module (a template's lowered name); '' for its entry."""


class CudaKernel:
    """``LoadedKernel.native``: the module, the function, and its reusable argument block.

    ``storage`` holds one 8-byte slot per parameter in the kernel's own order and
    ``params`` the pointers to them, built once at load; a launch packs buffers and
    scalars into their slots under ``lock`` (pointers the daemon supplies stay 0) and
    passes the address of ``params`` to cuLaunchKernel, which copies the values at enqueue.
    """

    __slots__ = (
        "buffer_count",
        "buffer_offsets",
        "dynamic_shared_limit",
        "function",
        "live",
        "lock",
        "module",
        "name",
        "params",
        "params_address",
        "scalar_count",
        "scalar_offsets",
        "storage",
    )

    def __init__(self, name: str, module: Any, function: Any, layout: Sequence[Param]) -> None:
        self.name = name
        self.module = module
        self.function = function
        self.buffer_offsets = tuple(
            _SLOT * i for i, p in enumerate(layout) if p.kind is ParamKind.BUFFER
        )
        self.scalar_offsets = tuple(
            _SLOT * i for i, p in enumerate(layout) if p.kind is ParamKind.SCALAR
        )
        self.buffer_count = len(self.buffer_offsets)
        self.scalar_count = len(self.scalar_offsets)
        slots = max(1, len(layout))
        self.storage = (ctypes.c_uint64 * slots)()
        base = ctypes.addressof(self.storage)
        self.params = (ctypes.c_void_p * slots)(*(base + _SLOT * i for i in range(slots)))
        self.params_address = ctypes.addressof(self.params)
        self.lock = threading.Lock()
        self.live = True
        self.dynamic_shared_limit = 0


_PACK_POINTER = struct.Struct("<Q").pack_into


class Kernels:
    """A device's kernels, for its ``CudaBackend``: artifacts are the caller's bytes; loaded
    kernels are tracked in the device's ``_kernels`` until ``destroy`` (in ``backend.py``)
    unloads them."""

    def __init__(self, state: DriverState) -> None:
        """``state``: the device's driver handles and tables (its ``CudaBackend``)."""
        self._state = state

    # -- artifacts -------------------------------------------------------------------------

    def create_artifact(self, request: ArtifactRequest) -> CompiledArtifact:
        """Compile (CUDA C++, through the disk cache) or take (PTX, cubin) a kernel image.

        Needs no context: compiles may run on worker threads.
        """
        if self._state._closed:
            raise Unavailable(f"the CUDA backend of device {self._state.device_ordinal} is closed")
        if request.format not in FORMATS:
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
            name = request.source_name
            compiled = self._state.cache.compile(
                source,
                arch=self._state.compute_capability,
                name=name,
                options=request.compile_options,
                headers=request.headers,
                name_expressions=_name_expressions(request.kernel_name),
            )
            symbol = compiled.symbol(request.kernel_name)
            image = _Image(compiled.kind, compiled.data, compiled.key, source, name, symbol)
        elif request.format is ArtifactFormat.CUDA_PTX:
            text = payload if isinstance(payload, bytes) else payload.encode()
            image = _Image("ptx", text.rstrip(b"\0"))
        else:
            image = _Image("cubin", self._binary_image(request))
        return CompiledArtifact(request, image)

    def _binary_image(self, request: ArtifactRequest) -> bytes:
        """A cubin or fatbin as given, or of per-architecture images the device's own: the
        exact one, else the newest of its major version below it (cubins run there)."""
        major, minor = self._state.compute_capability
        device = major * 10 + minor
        built = ", ".join(f"sm_{arch}" for arch, _ in request.images) or (
            f"sm_{request.arch}" if request.arch else ""
        )
        if request.images:
            fits = [(arch, data) for arch, data in request.images if arch // 10 == major]
            fits = [(arch, data) for arch, data in fits if arch <= device]
            if not fits:
                raise FailedPrecondition(
                    f"{request.origin}: no image for this device (sm_{device}); the catalog "
                    f"has {built}",
                    field="images",
                )
            return max(fits)[1]
        if request.arch is not None and (request.arch // 10 != major or request.arch > device):
            raise FailedPrecondition(
                f"{request.origin}: built for {built}; this device is sm_{device} (compile "
                f"it for sm_{device})",
                field="source",
            )
        if not isinstance(request.payload, bytes):
            raise InvalidArtifact(f"{request.kernel_name}: a cubin payload must be bytes")
        return request.payload

    def load_artifact(self, artifact: CompiledArtifact) -> LoadedKernel:
        """Load the image as its own module and find the kernel's symbol."""
        self._state._enter()
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
            self._state.cache.invalidate(image.cache_key)
            request = artifact.request
            fresh: KernelImage = self._state.cache.compile(
                image.source,
                arch=self._state.compute_capability,
                name=image.name,
                options=request.compile_options,
                headers=request.headers,
                name_expressions=_name_expressions(artifact.kernel_name),
                use_cache=False,
            )
            symbol = fresh.symbol(artifact.kernel_name)
            image = _Image(fresh.kind, fresh.data, fresh.key, image.source, image.name, symbol)
            artifact.image = image
            module = self._load_module(image, artifact.kernel_name)
        cu = self._state._cu
        try:
            function = self._state._check(
                cu.cuModuleGetFunction(module, (image.symbol or artifact.kernel_name).encode()),
                f"entry {artifact.kernel_name!r} (cuModuleGetFunction) in {artifact.origin}",
                FailedPrecondition,  # the manifest names no kernel of its code: not retryable
            )
            layout = artifact.request.params or _buffers_then_scalars(artifact.request)
            check_parameters(cu, function, layout, artifact.kernel_name, artifact.origin)
        except BaseException:
            cu.cuModuleUnload(module)
            raise
        kernel = CudaKernel(artifact.kernel_name, module, function, layout)
        loaded = LoadedKernel(
            id=next(self._state._ids), kernel_name=artifact.kernel_name, native=kernel
        )
        with self._state._lock:
            self._state._kernels[loaded.id] = loaded
        return loaded

    def _load_module(self, image: _Image, kernel_name: str) -> Any:
        data = image.data + b"\0" if image.kind == "ptx" else image.data
        return self._state._check(
            self._state._cu.cuModuleLoadData(data),
            f"cuModuleLoadData ({image.kind}) for {kernel_name}",
        )

    # -- launches ------------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> None:
        """Enqueue one kernel on the request's stream; returns without waiting.

        Buffers are passed as device pointers, then each scalar at its own dtype's size.
        """
        state = self._state
        if state._closed or DEVICE_FAULTS:
            state._enter()  # raises the reason
        if getattr(CURRENT, "ctx", None) != state._ctx_key:
            state._make_current()
        loaded = request.loaded
        kernel = loaded.native
        if state._kernels.get(loaded.id) is not loaded:
            raise InvalidArtifact(f"kernel {loaded.kernel_name!r} is not loaded on this backend")
        buffers = request.buffers
        scalars = request.scalars
        live = state._buffers
        addresses = [b.address for b in buffers if live.get(b.id) is b]
        if (
            len(addresses) != len(buffers)
            or len(buffers) != kernel.buffer_count
            or len(scalars) != kernel.scalar_count
        ):
            raise self._argument_mismatch(kernel, buffers, scalars)
        stream = request.stream
        if stream is None:
            handle = state._default_stream
        elif state._streams.get(stream.id) is stream:
            handle = stream.native
        else:
            raise LaunchArgumentMismatch(f"stream {stream.id} is not a live stream of this backend")
        gx, gy, gz = request.geometry.grid
        bx, by, bz = request.geometry.block
        shared = request.shared_memory_bytes
        with kernel.lock:
            storage = kernel.storage
            for offset, address in zip(kernel.buffer_offsets, addresses, strict=True):
                _PACK_POINTER(storage, offset, address)
            for offset, scalar in zip(kernel.scalar_offsets, scalars, strict=True):
                _SCALAR_PACK[scalar.dtype](storage, offset, scalar.value)
            if shared > kernel.dynamic_shared_limit:
                self._raise_shared_limit(kernel, shared)
            err = state._cu.cuLaunchKernel(
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
            raise state._check.error(
                err,
                f"cuLaunchKernel({kernel.name}, grid={(gx, gy, gz)}, block={(bx, by, bz)}, "
                f"shared={shared})",
                LaunchFailed,
            )

    def _argument_mismatch(
        self, kernel: CudaKernel, buffers: Sequence[DeviceBuffer], scalars: Sequence[Scalar]
    ) -> LaunchArgumentMismatch:
        for buffer in buffers:
            if self._state._buffers.get(buffer.id) is not buffer:
                return LaunchArgumentMismatch(
                    f"{kernel.name}: buffer {buffer.id} is not a live buffer of this backend"
                )
        return LaunchArgumentMismatch(
            f"{kernel.name} takes {kernel.buffer_count} buffers and {kernel.scalar_count} "
            f"scalars; got {len(buffers)} and {len(scalars)}"
        )

    def _raise_shared_limit(self, kernel: CudaKernel, shared: int) -> None:
        cu = self._state._cu
        attribute = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        self._state._check(
            cu.cuFuncSetAttribute(kernel.function, attribute, shared),
            f"cuFuncSetAttribute({kernel.name}, dynamic shared memory {shared})",
            LaunchFailed,
        )
        kernel.dynamic_shared_limit = shared


def _name_expressions(entry: str) -> list[str]:
    """A cuda_cpp entry that is a C++ name expression (``scale<float>``, ``ns::k``), which
    NVRTC must instantiate and lower; none for an ``extern "C"`` symbol."""
    return [] if entry.isidentifier() else [entry]


def _buffers_then_scalars(request: ArtifactRequest) -> tuple[Param, ...]:
    buffers = request.argument_count - request.scalar_argument_count
    return (Param(ParamKind.BUFFER),) * buffers + (
        Param(ParamKind.SCALAR),  # its size unknown here: the count is still checked
    ) * request.scalar_argument_count
