"""Exported buffers on the client's side: the daemon's memory, mapped here with no copy.

``Buffer.export()`` asks the daemon (``ExportBuffer``), which answers once the
work queued on the buffer before is over, takes the one descriptor from the
handoff socket and maps it: with cuda-python for a CUDA buffer
(``_cuda_map``), with ``mmap`` for the host backend's. The result speaks
DLPack (``cupy.from_dlpack``, ``torch.from_dlpack``, ``numpy.from_dlpack`` for a
host buffer) and, on CUDA, ``__cuda_array_interface__``.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np

from accy import _dlpack, _handoff
from accy._cuda_map import CudaMapping
from accy.errors import FailedPrecondition
from accy.protocol.launch.v1 import launch_pb2 as pb

__all__ = ["ExportedBuffer", "map_export"]


class _HostMapping:
    def __init__(self, fd: int, size: int) -> None:
        try:
            if os.fstat(fd).st_size < size:
                raise OSError("the exported memory is smaller than the daemon said")
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.array = np.frombuffer(self.map, dtype=np.uint8)
        self.address = int(self.array.ctypes.data)


class ExportedBuffer:
    """One buffer's memory mapped in this process: made by ``Buffer.export`` only.

    The mapping is this process's own. It stays valid after the buffer is freed
    (the memory lives until the daemon and every mapping let go, so it is never
    handed to another client meanwhile) until ``close()``, or until every array
    made from it through DLPack is gone, whichever is later. What the daemon did
    to the buffer before ``export()`` is visible; work the daemon queues on it
    afterwards is not ordered with your reads: export again after waiting for it.
    Work you queue on the memory yourself is yours to finish (synchronize your
    stream) before the daemon uses the buffer again.
    """

    buffer_id: str
    nbytes: int
    dtype: np.dtype[Any]
    device: int
    """The daemon's device index."""
    _mapping: CudaMapping | _HostMapping | None
    _offset: int
    _dlpack_device: tuple[int, int]

    def __init__(self, *_: object, **__: object) -> None:
        raise TypeError("an ExportedBuffer is made by Buffer.export()")

    def __repr__(self) -> str:
        where = "cuda" if self.is_cuda else "host"
        state = " closed" if self._mapping is None else ""
        return f"<accy.ExportedBuffer {self.buffer_id} {self.nbytes} bytes {where}{state}>"

    @property
    def is_cuda(self) -> bool:
        return self._dlpack_device[0] == _dlpack.CUDA

    @property
    def shape(self) -> tuple[int]:
        return (self.nbytes // self.dtype.itemsize,)

    @property
    def ptr(self) -> int:
        """The first byte's address in this process (a device pointer on CUDA)."""
        return self._live().address + self._offset

    def _live(self) -> CudaMapping | _HostMapping:
        mapping = self._mapping
        if mapping is None:
            raise FailedPrecondition(
                f"the export of buffer {self.buffer_id} was closed: export it again",
                reason="EXPORT_CLOSED",
            )
        return mapping

    def numpy(self) -> np.ndarray[Any, Any]:
        """The host buffer as a numpy array over the shared pages (host backend only)."""
        mapping = self._live()
        if not isinstance(mapping, _HostMapping):
            raise FailedPrecondition(
                "a CUDA buffer's memory is on the GPU: use cupy.from_dlpack or torch.from_dlpack",
                reason="NOT_HOST_MEMORY",
            )
        return mapping.array[self._offset : self._offset + self.nbytes].view(self.dtype)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        if not self.is_cuda:
            raise AttributeError("a host buffer has no __cuda_array_interface__")
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.ptr, False),
            "version": 3,
            "strides": None,
            "stream": None,  # export() returned after the daemon's work on it was over
        }

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._dlpack_device

    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """A DLPack capsule over this memory (no copy); it keeps the mapping alive. ``stream``
        needs no wait: the daemon's work on the buffer was over when ``export()`` returned."""
        if copy:
            raise BufferError("an exported buffer is shared memory: it is never copied")
        if dl_device is not None and tuple(dl_device) != self._dlpack_device:
            raise BufferError(f"the buffer is on {self._dlpack_device}, not {dl_device}")
        mapping = self._live()
        count = self.shape[0]
        return _dlpack.capsule(mapping, self.ptr, count, self.dtype, self._dlpack_device)

    def close(self) -> None:
        """Drop this mapping (idempotent): it is unmapped once no array made from it through
        DLPack (or ``numpy()``) is left. One read through ``__cuda_array_interface__`` is
        not counted: close only after you are done with it."""
        self._mapping = None

    def __enter__(self) -> ExportedBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def map_export(
    response: pb.ExportBufferResponse, socket_path: Path, buffer_id: str, dtype: np.dtype[Any]
) -> ExportedBuffer:
    """Take the offered descriptor and map it (for ``Buffer.export``)."""
    path = socket_path.with_name(response.handoff_name)
    (fd,) = _handoff.take(path, response.export_id, response.ticket, 1)
    size = response.mapping_size
    if response.offset + response.byte_size > size:
        os.close(fd)
        raise FailedPrecondition("the daemon's export does not hold the buffer it names")
    mapping: CudaMapping | _HostMapping
    if response.kind == pb.EXPORT_KIND_CUDA_VMM:
        mapping = CudaMapping(fd, size, response.gpu_uuid)
        device = (_dlpack.CUDA, mapping.ordinal)
    elif response.kind == pb.EXPORT_KIND_HOST_MEMFD:
        mapping = _HostMapping(fd, size)
        device = (_dlpack.CPU, 0)
    else:
        os.close(fd)
        raise FailedPrecondition(f"this client cannot map exports of kind {response.kind}")
    exported = object.__new__(ExportedBuffer)
    exported.buffer_id = buffer_id
    exported.nbytes = response.byte_size
    exported.dtype = dtype
    exported.device = response.device
    exported._mapping = mapping
    exported._offset = response.offset
    exported._dlpack_device = device
    return exported
