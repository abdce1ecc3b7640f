"""CUDA shared memory for the KServe door, off unless the operator turns it on.

A CUDA IPC handle is a bearer token: any process that sees its 64 bytes can
open the memory behind it. So the daemon takes them only when the operator
asks (``--kserve-cuda-shared-memory``), only from callers on its host, and
checks each one at registration: the handle opens (``cuIpcOpenMemHandle``) on
the device named, which is one the daemon serves, and the allocation behind
it holds the size declared. Regions belong to the client that registered
them, are closed with it, and at most ``MAX_REGIONS`` per client. Tensors move
through host memory (a device-to-host copy out of the region, then the
ordinary write into the session's buffer), with the device's primary context
current on the calling thread.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from accyd.clipping import clip
from accyd.errors import AlreadyExists, InvalidRequest, NotFound, QuotaExceeded, RuntimeUnavailable

__all__ = ["HANDLE_BYTES", "CudaRegion", "CudaRegions"]

HANDLE_BYTES = 64
"""The size of a cudaIpcMemHandle_t."""
MAX_REGIONS = 64


@dataclass(frozen=True, slots=True)
class CudaRegion:
    name: str
    device_id: int
    byte_size: int
    pointer: int


def _driver() -> Any:
    try:
        from cuda.bindings import driver  # type: ignore[import-untyped, unused-ignore]
    except ImportError as error:  # pragma: no cover - on machines without cuda-bindings
        raise RuntimeUnavailable(f"CUDA shared memory needs cuda-bindings: {error}") from None
    return driver


def _check(result: Any, what: str) -> Any:
    """A driver call's value, or ``InvalidRequest`` naming the call that failed."""
    error, *values = result if isinstance(result, tuple) else (result,)
    if int(error) != 0:
        raise InvalidRequest(
            f"{what} failed ({getattr(error, 'name', int(error))})", field="raw_handle"
        )
    return values[0] if len(values) == 1 else tuple(values)


def _ipc_handle(driver: Any, handle: bytes) -> Any:
    """A ``CUipcMemHandle`` holding ``handle`` (newer bindings have no ``reserved`` field)."""
    ipc = driver.CUipcMemHandle()
    try:
        ipc.reserved = handle
    except AttributeError:
        ctypes.memmove(ipc.getPtr(), handle, HANDLE_BYTES)
    return ipc


class CudaRegions:
    """Every client's CUDA regions, on the GPUs the daemon serves."""

    def __init__(self, gpus: Collection[int]) -> None:
        self.gpus = frozenset(gpus)
        self._regions: dict[str, dict[str, CudaRegion]] = {}
        self._contexts: dict[int, Any] = {}
        self._lock = threading.Lock()

    def _context(self, device_id: int) -> Any:
        with self._lock:
            context = self._contexts.get(device_id)
            if context is None:
                driver = _driver()
                _check(driver.cuInit(0), "cuInit")
                device = _check(driver.cuDeviceGet(device_id), "cuDeviceGet")
                context = self._contexts[device_id] = _check(
                    driver.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain"
                )
            return context

    def register(
        self, client_id: str, name: str, handle: bytes, device_id: int, byte_size: int
    ) -> None:
        """*Blocking*: open the handle on ``device_id`` and keep ``byte_size`` bytes of it."""
        if not name or len(name) > 256:
            raise InvalidRequest("a region name is 1 to 256 characters", field="name")
        if len(handle) != HANDLE_BYTES:
            raise InvalidRequest(
                f"raw_handle is {len(handle)} bytes; a CUDA IPC handle is {HANDLE_BYTES}",
                field="raw_handle",
            )
        if device_id not in self.gpus:
            raise InvalidRequest(
                f"device {device_id} is not served here; this daemon serves GPUs "
                f"{sorted(self.gpus)}",
                field="device_id",
            )
        if byte_size <= 0:
            raise InvalidRequest("byte_size must be positive", field="byte_size")
        with self._lock:
            mine = self._regions.setdefault(client_id, {})
            if name in mine:
                raise AlreadyExists(
                    f"a region named {clip(name)!r} is registered already", field="name"
                )
            if len(mine) >= MAX_REGIONS:
                raise QuotaExceeded(
                    f"a client holds at most {MAX_REGIONS} CUDA regions", quota="cuda_regions"
                )
        driver = _driver()
        context = self._context(device_id)
        _check(driver.cuCtxPushCurrent(context), "cuCtxPushCurrent")
        try:
            ipc = _ipc_handle(driver, handle)
            flags = driver.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
            pointer = _check(driver.cuIpcOpenMemHandle(ipc, flags), "cuIpcOpenMemHandle")
            try:
                base, size = _check(driver.cuMemGetAddressRange(pointer), "cuMemGetAddressRange")
                room = int(size) - (int(pointer) - int(base))
                if byte_size > room:
                    raise InvalidRequest(
                        f"byte_size {byte_size} is past the allocation behind the handle "
                        f"({room} bytes)",
                        field="byte_size",
                    )
            except BaseException:
                driver.cuIpcCloseMemHandle(pointer)
                raise
        finally:
            driver.cuCtxPopCurrent()
        with self._lock:
            self._regions.setdefault(client_id, {})[name] = CudaRegion(
                name, device_id, byte_size, int(pointer)
            )

    def unknown(self, name: str) -> NotFound:
        return NotFound(f"no CUDA shared-memory region {clip(name)!r} of yours", field="name")

    def status(self, client_id: str, name: str) -> list[CudaRegion]:
        with self._lock:
            mine = self._regions.get(client_id, {})
            if not name:
                return list(mine.values())
            found = mine.get(name)
        if found is None:
            raise self.unknown(name)
        return [found]

    def find(self, client_id: str, name: str) -> CudaRegion | None:
        with self._lock:
            return self._regions.get(client_id, {}).get(name)

    def unregister(self, client_id: str, name: str) -> None:
        """*Blocking*: close region ``name`` of the client (``""``: every one)."""
        with self._lock:
            mine = self._regions.get(client_id, {})
            gone = list(mine.values()) if not name else [r for r in [mine.get(name)] if r]
            for region in gone:
                del mine[region.name]
            if not mine:
                self._regions.pop(client_id, None)
        if not gone:
            return
        driver = _driver()
        for region in gone:
            context = self._context(region.device_id)
            driver.cuCtxPushCurrent(context)
            try:
                driver.cuIpcCloseMemHandle(driver.CUdeviceptr(region.pointer))
            finally:
                driver.cuCtxPopCurrent()

    def copy(self, region: CudaRegion, offset: int, data: bytearray | None, size: int) -> bytes:
        """*Blocking*: read ``size`` bytes at ``offset`` (``data`` None), or write ``data``."""
        if offset < 0 or offset + size > region.byte_size:
            raise InvalidRequest(
                f"bytes {offset}..{offset + size} are outside CUDA region {region.name!r} of "
                f"{region.byte_size} bytes",
                field="parameters.shared_memory_offset",
            )
        driver = _driver()
        _check(driver.cuCtxPushCurrent(self._context(region.device_id)), "cuCtxPushCurrent")
        try:
            at = driver.CUdeviceptr(region.pointer + offset)
            if data is None:
                out = bytearray(size)
                _check(driver.cuMemcpyDtoH(out, at, size), "cuMemcpyDtoH")
                return bytes(out)
            _check(driver.cuMemcpyHtoD(at, bytes(data), size), "cuMemcpyHtoD")
            return b""
        finally:
            driver.cuCtxPopCurrent()
