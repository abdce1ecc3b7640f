"""The CUDA backend's staging: slots of page-locked memory (``cuMemHostAlloc``, once) and an
event per slot, and the shared memory it page-locks only once a range earned it.

``accyd.backends.staging`` has the why and the engine; ``accyd.backends.shared_ranges``
the ranges ``pin_host`` records. The slots are allocated on a thread of their own
when the backend starts (64 MiB: about 50 ms), so the first large copy finds them
ready; they and their events are freed by ``close`` before the context goes.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from accyd.backends.base import DeviceBuffer, Stream
from accyd.backends.cuda.driver import ErrorCheck
from accyd.backends.shared_ranges import SharedRanges, StagedCopies
from accyd.backends.staging import CHUNK_BYTES, SLOTS, LazyStaging, Staging
from accyd.errors import LaunchFailed, OutOfMemory

__all__ = ["CudaStaging", "cuda_staged_copies"]


class _Device(Protocol):
    """What the staging needs of ``CudaBackend``."""

    _cu: Any
    _check: ErrorCheck

    def _enter(self) -> None: ...

    def _stream_handle(self, stream: Stream | None) -> Any: ...


class CudaStaging:
    """The slots' memory and events, and the DMA through them (``Dma`` for ``Staging``)."""

    def __init__(self, device: _Device, slots: int = SLOTS, chunk: int = CHUNK_BYTES) -> None:
        self._device = device
        self.pointers: list[int] = []
        self.events: list[Any] = []
        cu = device._cu
        device._enter()
        try:
            for _ in range(slots):
                self.pointers.append(
                    int(
                        device._check(
                            cu.cuMemHostAlloc(chunk, cu.CU_MEMHOSTALLOC_PORTABLE),
                            "cuMemHostAlloc",
                            OutOfMemory,
                        )
                    )
                )
                self.events.append(
                    device._check(
                        cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate"
                    )
                )
        except BaseException:
            self.free()
            raise
        self.views = [
            np.ctypeslib.as_array(
                ctypes.cast(pointer, ctypes.POINTER(ctypes.c_ubyte)), shape=(chunk,)
            ).data
            for pointer in self.pointers
        ]

    def to_device(
        self, slot: int, buffer: DeviceBuffer, offset: int, size: int, stream: Stream | None
    ) -> int:
        cu = self._device._cu
        return self._copy(
            slot, cu.cuMemcpyHtoDAsync, buffer.address + offset, self.pointers[slot], size, stream
        )

    def to_host(
        self, slot: int, buffer: DeviceBuffer, offset: int, size: int, stream: Stream | None
    ) -> int:
        cu = self._device._cu
        return self._copy(
            slot, cu.cuMemcpyDtoHAsync, self.pointers[slot], buffer.address + offset, size, stream
        )

    def _copy(
        self, slot: int, copy: Any, target: int, source: int, size: int, stream: Stream | None
    ) -> int:
        """``copy`` (an async driver copy) on ``stream``, then the slot's event recorded."""
        device = self._device
        handle = device._stream_handle(stream)
        device._check(
            copy(target, source, size, handle), getattr(copy, "__name__", "a copy"), LaunchFailed
        )
        device._check(
            device._cu.cuEventRecord(self.events[slot], handle), "cuEventRecord", LaunchFailed
        )
        return slot

    def wait(self, slot: int) -> None:
        device = self._device
        device._check(
            device._cu.cuEventSynchronize(self.events[slot]), "cuEventSynchronize", LaunchFailed
        )

    def free(self) -> None:
        """Free the slots and events (best effort: a poisoned context refuses, freeing nothing
        more); the caller makes the context current first."""
        cu = self._device._cu
        for view in getattr(self, "views", ()):
            view.release()
        for event in self.events:
            cu.cuEventDestroy(event)
        for pointer in self.pointers:
            cu.cuMemFreeHost(pointer)
        self.events, self.pointers = [], []


def cuda_staged_copies(
    device: _Device,
    register: Callable[[memoryview], object],
    unregister: Callable[[object], None],
) -> tuple[StagedCopies, Callable[[], None]]:
    """The backend's staged copies (slots made in the background from now on), and what frees
    the slots at ``close``."""
    made: list[CudaStaging] = []

    def make() -> Staging[int]:
        slots = CudaStaging(device)
        made.append(slots)
        return Staging(slots.views, slots)

    def free() -> None:
        for slots in made:
            slots.free()

    staged = StagedCopies(SharedRanges(register, unregister), LazyStaging(make, background=True))
    return staged, free
