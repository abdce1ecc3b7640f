"""Exportable device memory: CUDA VMM allocations whose POSIX descriptor another process maps.

A plain ``cuMemAlloc`` allocation can only be shared through legacy IPC handles: 64
bytes that any process on the host holding them can open. A VMM allocation made
with ``CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`` is shared as a file descriptor
instead, which goes only where it is sent (``SCM_RIGHTS``), so only the client it is
handed to can map it. The physical memory lives while the daemon's handle or any
importer's mapping holds it, so a buffer freed here is never reused under a client
that still maps it.
"""

from __future__ import annotations

import os
from typing import Any

from accyd.backends.base import round_up
from accyd.backends.cuda.driver import ErrorCheck
from accyd.errors import LaunchFailed, OutOfMemory

__all__ = ["Plain", "Shareable", "allocate_shareable", "granularity"]


class Plain:
    """``DeviceBuffer.native`` of a ``cuMemAlloc`` buffer: the pointer it returned."""

    __slots__ = ("base",)

    def __init__(self, base: int) -> None:
        self.base = base

    def free(self, cu: Any) -> Any:
        return cu.cuMemFree(self.base)


class Shareable:
    """``DeviceBuffer.native`` of an exportable buffer: the VMM handle, its mapping and its
    POSIX descriptor.

    Owned by the ``CudaBackend`` that made it, freed by its ``destroy`` (close the
    descriptor, unmap, free the address range, release the handle) on the backend's
    context. The descriptor is made once, with the buffer: the driver takes about 1 ms
    to make one (H200), a duplicate takes microseconds.
    """

    __slots__ = ("base", "fd", "handle", "size")

    def __init__(self, handle: Any, base: int, size: int, fd: int) -> None:
        self.handle = handle
        self.base = base
        self.size = size
        self.fd = fd

    def free(self, cu: Any) -> Any:
        """Close the descriptor (an open one would keep the memory), unmap, free the range
        and release the handle; the first failure's result."""
        os.close(self.fd)
        results = [
            cu.cuMemUnmap(self.base, self.size),
            cu.cuMemAddressFree(self.base, self.size),
            cu.cuMemRelease(self.handle),
        ]
        return next((r for r in results if r[0]), results[-1])

    def export(self) -> int:
        """A new POSIX descriptor of the memory; the caller owns it."""
        return os.dup(self.fd)


def _properties(cu: Any, ordinal: int) -> Any:
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = ordinal
    prop.requestedHandleTypes = (
        cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    )
    return prop


def granularity(cu: Any, check: ErrorCheck, ordinal: int) -> int:
    """The size an exportable allocation on ``ordinal`` is a whole multiple of."""
    flag = cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
    result = cu.cuMemGetAllocationGranularity(_properties(cu, ordinal), flag)
    return int(check(result, "cuMemGetAllocationGranularity"))


def allocate_shareable(cu: Any, check: ErrorCheck, ordinal: int, byte_size: int) -> Shareable:
    """Create, reserve, map, open for read-write and export ``byte_size`` bytes (rounded up
    to the granularity) on device ``ordinal``; everything made is undone if a step fails."""
    step = granularity(cu, check, ordinal)
    size = round_up(byte_size, step)
    handle = check(cu.cuMemCreate(size, _properties(cu, ordinal), 0), "cuMemCreate", OutOfMemory)
    undo = [lambda: cu.cuMemRelease(handle)]
    try:
        base = int(check(cu.cuMemAddressReserve(size, step, 0, 0), "cuMemAddressReserve"))
        undo.append(lambda: cu.cuMemAddressFree(base, size))
        check(cu.cuMemMap(base, size, 0, handle, 0), "cuMemMap")
        undo.append(lambda: cu.cuMemUnmap(base, size))
        access = cu.CUmemAccessDesc()
        access.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = ordinal
        access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        check(cu.cuMemSetAccess(base, size, [access], 1), "cuMemSetAccess")
        kind = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        result = cu.cuMemExportToShareableHandle(handle, kind, 0)
        fd = int(check(result, "cuMemExportToShareableHandle", LaunchFailed))
    except BaseException:
        for step_back in reversed(undo):
            step_back()
        raise
    return Shareable(handle, base, size, fd)
