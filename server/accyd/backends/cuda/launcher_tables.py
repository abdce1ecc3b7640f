"""The device launcher's tables, and the host's reads and writes of them.

Their layout is ``launcher_source``'s.

Ownership, on the launcher's CUDA device: the ring table, the counters and the epoch words
(``cuMemAlloc``), the control page (``cuMemHostAlloc``, mapped: stop and generation, the
instances' acknowledgements, and the host's staging and copies) and the stream the host's
writes go on are made here; their frees are put on the launcher's ``owned`` list, which its
``close()`` (or its ``weakref.finalize`` net) runs once every instance stopped.

Every host write to device memory is copied from the pinned staging on that stream and waited
for, so it is in device memory before the write that follows it (a generation, a ``live``
word). A copy from pageable memory may return before it lands.
"""

from __future__ import annotations

import ctypes
import functools
import struct
import threading
from collections.abc import Callable
from typing import Any

from accyd.backends.cuda import launcher_source as lay
from accyd.backends.cuda.driver import ErrorCheck

__all__ = ["LauncherTables"]


class LauncherTables:
    """The launcher's memory, made in ``__init__`` with ``enter``'s context current (each call
    makes it current again: any thread may revoke)."""

    def __init__(
        self,
        cu: Any,
        check: ErrorCheck,
        enter: Callable[[], None],
        owned: list[Callable[[], object]],
    ) -> None:
        self._cu, self._check, self._enter = cu, check, enter
        self.rings = self._device_zeroed(lay.MAX_RINGS * lay.RING_BYTES, owned)
        self.stats = self._device_zeroed(lay.STATS_BYTES, owned)
        self.epochs = self._device_zeroed(8 * lay.EPOCHS, owned)
        flags = cu.CU_MEMHOSTALLOC_DEVICEMAP | cu.CU_MEMHOSTALLOC_PORTABLE
        host = int(check(cu.cuMemHostAlloc(lay.CONTROL_BYTES, flags), "cuMemHostAlloc"))
        owned.append(functools.partial(cu.cuMemFreeHost, host))
        ctypes.memset(host, 0, lay.CONTROL_BYTES)
        self.control = int(check(cu.cuMemHostGetDevicePointer(host, 0), "device pointer"))
        """The control page's device address (the instances write their acks there)."""
        self._u32 = (ctypes.c_uint32 * (lay.STAGING_OFFSET // 4)).from_address(host)
        self._staging = host + lay.STAGING_OFFSET
        self._epochs_host = host + lay.EPOCH_OFFSET
        self._epoch_words = (ctypes.c_uint64 * lay.EPOCHS).from_address(self._epochs_host)
        non_blocking = cu.CUstream_flags.CU_STREAM_NON_BLOCKING
        self._stream = check(cu.cuStreamCreate(non_blocking), "cuStreamCreate")
        owned.append(functools.partial(cu.cuStreamDestroy, self._stream))
        self._lock = threading.Lock()
        """Held while the staging or an epoch's copy is in use."""

    def _device_zeroed(self, size: int, owned: list[Callable[[], object]]) -> int:
        cu, check = self._cu, self._check
        address = int(check(cu.cuMemAlloc(size), "cuMemAlloc"))
        owned.append(functools.partial(cu.cuMemFree, address))  # the value, not ``self``
        check(cu.cuMemsetD8(address, 0, size), "cuMemsetD8")
        return address

    # -- where things are ------------------------------------------------------------------

    def ring(self, slot: int) -> int:
        """Ring ``slot``'s entry (device address)."""
        return self.rings + slot * lay.RING_BYTES

    def ticket(self, slot: int, index: int) -> int:
        """Ticket ``index`` of ring ``slot`` (device address)."""
        return self.ring(slot) + lay.TICKET_OFFSET + index * lay.TICKET_BYTES

    def epoch(self, epoch: int) -> int:
        """Epoch word ``epoch`` (device address)."""
        return self.epochs + 8 * epoch

    # -- reading and writing -------------------------------------------------------------

    def read(self, address: int, size: int) -> bytearray:
        """``size`` bytes of device memory at ``address`` (synchronous)."""
        self._enter()
        raw = bytearray(size)
        self._check(self._cu.cuMemcpyDtoH(raw, address, size), "cuMemcpyDtoH")
        return raw

    def write(self, address: int, data: bytes) -> None:
        """Copy ``data`` to device ``address`` through the pinned staging, and wait until it
        is there."""
        if len(data) > lay.EPOCH_OFFSET - lay.STAGING_OFFSET:
            raise ValueError(f"{len(data)} bytes do not fit the launcher's staging")
        with self._lock:
            ctypes.memmove(self._staging, data, len(data))
            self._copy(address, self._staging, len(data))

    def put_u32(self, address: int, value: int) -> None:
        self.write(address, struct.pack("<I", value))

    def _copy(self, address: int, host: int, size: int) -> None:
        cu, check = self._cu, self._check
        self._enter()
        check(cu.cuMemcpyHtoDAsync(address, host, size, self._stream), "cuMemcpyHtoDAsync")
        check(cu.cuStreamSynchronize(self._stream), "cuStreamSynchronize")

    # -- stop, generation, acks and epochs -------------------------------------------------

    @property
    def generation(self) -> int:
        return int(self._u32[lay.GENERATION_OFFSET // 4])

    def set_signal(self, *, stop: int | None = None, generation: int | None = None) -> None:
        """Set the control page's stop or generation, which every instance reads each round
        (the caller serializes these: the launcher's lock)."""
        if stop is not None:
            self._u32[lay.STOP_OFFSET // 4] = stop
        if generation is not None:
            self._u32[lay.GENERATION_OFFSET // 4] = generation

    def ack(self, instance: int) -> int:
        """The generation instance ``instance`` last acknowledged."""
        return int(self._u32[lay.ACK_OFFSET // 4 + instance])

    def epoch_value(self, epoch: int) -> int:
        return int(self._epoch_words[epoch])

    def bump_epoch(self, epoch: int) -> None:
        """Move epoch word ``epoch`` on, in device memory too (waited for)."""
        with self._lock:
            self._epoch_words[epoch] += 1
            self._copy(self.epoch(epoch), self._epochs_host + 8 * epoch, 8)
