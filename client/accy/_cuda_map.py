"""Mapping a buffer the daemon exported as CUDA VMM memory into this process, with cuda-python.

The descriptor is imported (``cuMemImportFromShareableHandle``), mapped at an
address range reserved here and opened for read and write on the GPU the daemon
named by UUID (ordinals differ between processes: ``CUDA_VISIBLE_DEVICES``,
containers). The range is usable from every context on that GPU in this
process, CuPy's and PyTorch's included: they run on the primary context, which
the mapping retains until it is unmapped.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import threading
from typing import Any

from accy.errors import FailedPrecondition, Internal

__all__ = ["CudaMapping"]


def _driver() -> Any:
    try:
        return importlib.import_module("cuda.bindings.driver")
    except ImportError as error:
        raise FailedPrecondition(
            f"mapping an exported CUDA buffer needs cuda-python (cuda-bindings): {error}",
            reason="CUDA_UNAVAILABLE",
        ) from None


def _check(result: Any, what: str) -> Any:
    if result[0]:
        raise Internal(f"{what} failed mapping an exported buffer: {result[0]!r}")
    return result[1] if len(result) == 2 else None


@functools.cache
def _ordinal_of(cu: Any, uuid: bytes) -> int:
    """The ordinal of the GPU ``uuid`` names in this process (asked once per GPU)."""
    _check(cu.cuInit(0), "cuInit")
    count = int(_check(cu.cuDeviceGetCount(), "cuDeviceGetCount"))
    get_uuid = getattr(cu, "cuDeviceGetUuid_v2", None) or cu.cuDeviceGetUuid
    for ordinal in range(count):
        device = _check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
        if bytes(_check(get_uuid(device), "cuDeviceGetUuid").bytes) == uuid:
            return ordinal
    raise FailedPrecondition(
        f"the daemon's GPU (UUID {uuid.hex()}) is not visible to this process "
        f"({count} GPUs are): check CUDA_VISIBLE_DEVICES or the container's devices",
        reason="GPU_NOT_VISIBLE",
    )


class CudaMapping:
    """One exported buffer mapped here: owns the import, the address range and a reference
    to the GPU's primary context; ``unmap`` (idempotent) gives all three back."""

    def __init__(self, fd: int, size: int, uuid: bytes) -> None:
        """Takes ``fd`` (closed here, mapped or not)."""
        try:
            cu = self._cu = _driver()
            self.ordinal = _ordinal_of(cu, uuid)
            self._device = _check(cu.cuDeviceGet(self.ordinal), "cuDeviceGet")
            ctx = self._ctx = _check(
                cu.cuDevicePrimaryCtxRetain(self._device), "cuDevicePrimaryCtxRetain"
            )
            kind = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
            undo: list[Any] = [lambda: cu.cuDevicePrimaryCtxRelease(self._device)]
            try:
                _check(cu.cuCtxPushCurrent(ctx), "cuCtxPushCurrent")
                undo.append(cu.cuCtxPopCurrent)
                handle = _check(
                    cu.cuMemImportFromShareableHandle(fd, kind), "cuMemImportFromShareableHandle"
                )
                undo.append(lambda: cu.cuMemRelease(handle))
                self.address = int(
                    _check(cu.cuMemAddressReserve(size, 0, 0, 0), "cuMemAddressReserve")
                )
                undo.append(lambda: cu.cuMemAddressFree(self.address, size))
                _check(cu.cuMemMap(self.address, size, 0, handle, 0), "cuMemMap")
                undo.append(lambda: cu.cuMemUnmap(self.address, size))
                access = cu.CUmemAccessDesc()
                access.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
                access.location.id = self.ordinal
                access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                _check(cu.cuMemSetAccess(self.address, size, [access], 1), "cuMemSetAccess")
            except BaseException:
                for step in reversed(undo):
                    step()
                raise
            cu.cuMemRelease(handle)  # the mapping holds the memory from here on
            cu.cuCtxPopCurrent()
        finally:
            os.close(fd)
        self.size = size
        self._lock = threading.Lock()
        self._mapped = True

    def unmap(self) -> None:
        with self._lock:
            if not self._mapped:
                return
            self._mapped = False
        cu = self._cu
        cu.cuCtxPushCurrent(self._ctx)
        cu.cuMemUnmap(self.address, self.size)
        cu.cuMemAddressFree(self.address, self.size)
        cu.cuCtxPopCurrent()
        cu.cuDevicePrimaryCtxRelease(self._device)

    def __del__(self) -> None:
        if getattr(self, "_mapped", False):
            with contextlib.suppress(Exception):  # at exit the driver may be gone first
                self.unmap()
