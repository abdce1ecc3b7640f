"""Split buffer writes into stream chunks and gather read chunks back into one array."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from accy.errors import DataLoss, FieldViolation, InvalidArgument
from accy.protocol.launch.v1 import launch_pb2

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "MAX_CHUNK_SIZE",
    "Gathered",
    "Progress",
    "as_bytes",
    "check_chunk_size",
    "gather",
    "write_chunks",
]

DEFAULT_CHUNK_SIZE = 1 << 20
"""Bytes per stream message unless the caller says otherwise."""

MAX_CHUNK_SIZE = (4 << 20) - (64 << 10)
"""The largest chunk that still fits gRPC's default 4 MiB message limit with room to spare."""

Progress = Callable[[int, int], None]
"""Called with (bytes done, bytes total) after every chunk."""


def check_chunk_size(chunk_size: int) -> int:
    """``chunk_size`` if it fits one message; ``InvalidArgument`` otherwise."""
    if not 1 <= chunk_size <= MAX_CHUNK_SIZE:
        why = f"must be 1..{MAX_CHUNK_SIZE} bytes, got {chunk_size}"
        raise InvalidArgument(
            f"chunk size {why}", field_violations=[FieldViolation("chunk_size", why)]
        )
    return chunk_size


def as_bytes(array: np.ndarray[Any, Any], dtype: np.dtype[Any]) -> memoryview:
    """The array's elements as ``dtype``, C-ordered and little-endian, viewed as bytes."""
    flat = np.ascontiguousarray(array, dtype=dtype.newbyteorder("<")).reshape(-1)
    return memoryview(flat.view(np.uint8).data)


def write_chunks(
    buffer_id: str,
    data: memoryview,
    offset: int,
    chunk_size: int,
    progress: Progress | None = None,
) -> Iterator[launch_pb2.WriteBufferChunk]:
    """The WriteBuffer stream for ``data`` at byte ``offset``: the first chunk names the buffer."""
    total = len(data)
    if total == 0:
        yield launch_pb2.WriteBufferChunk(buffer_id=buffer_id, offset=offset)
        return
    for start in range(0, total, chunk_size):
        piece = bytes(data[start : start + chunk_size])
        yield launch_pb2.WriteBufferChunk(
            buffer_id=buffer_id if start == 0 else "", offset=offset + start, data=piece
        )
        if progress is not None:
            progress(start + len(piece), total)


class Gathered:
    """Read chunks placed by their offsets into ``size`` bytes that start at byte ``offset``,
    one at a time (``take``), for a stream read by a loop or by an iterator alike."""

    def __init__(self, offset: int, size: int, progress: Progress | None = None) -> None:
        self.out = np.empty(size, dtype=np.uint8)
        self._offset = offset
        self._size = size
        self._progress = progress
        self._received = 0

    def take(self, chunk: launch_pb2.ReadBufferChunk) -> None:
        """Place one chunk; one outside the requested bytes raises ``DataLoss``."""
        data = chunk.data  # each access copies the bytes out of the message: once only
        start = chunk.offset - self._offset
        end = start + len(data)
        if start < 0 or end > self._size:
            raise DataLoss(
                f"read chunk at offset {chunk.offset} ({len(data)} bytes) "
                f"falls outside the requested bytes {self._offset}..{self._offset + self._size}"
            )
        self.out[start:end] = np.frombuffer(data, dtype=np.uint8)
        self._received += len(data)
        if self._progress is not None:
            self._progress(self._received, self._size)

    def result(self) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """The bytes, once every chunk came; ``DataLoss`` if some did not."""
        if self._received != self._size:
            raise DataLoss(f"read returned {self._received} of {self._size} bytes")
        return self.out


def gather(
    chunks: Iterable[launch_pb2.ReadBufferChunk],
    offset: int,
    size: int,
    progress: Progress | None = None,
) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """Place each chunk by its offset into ``size`` bytes that start at byte ``offset``."""
    gathered = Gathered(offset, size, progress)
    for chunk in chunks:
        gathered.take(chunk)
    return gathered.result()
