"""Splitting writes into chunks and gathering reads back, for any size and chunk size."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accy import _chunks
from accy.errors import DataLoss, InvalidArgument
from accy.protocol.launch.v1 import launch_pb2 as pb


@settings(deadline=None)  # timing under a loaded machine is not the property
@given(
    size=st.integers(min_value=0, max_value=5000),
    chunk=st.integers(min_value=1, max_value=700),
    offset=st.integers(min_value=0, max_value=100),
)
def test_write_chunks_cover_the_data_once(size: int, chunk: int, offset: int) -> None:
    data = memoryview(np.arange(size, dtype=np.uint8).tobytes())
    progress: list[tuple[int, int]] = []
    chunks = list(
        _chunks.write_chunks("b1", data, offset, chunk, lambda d, t: progress.append((d, t)))
    )
    assert chunks[0].buffer_id == "b1"
    assert all(c.buffer_id == "" for c in chunks[1:])
    assert all(len(c.data) <= chunk for c in chunks)
    assert b"".join(c.data for c in chunks) == bytes(data)
    assert [c.offset for c in chunks] == [offset + i * chunk for i in range(len(chunks))]
    if size:
        assert progress[-1] == (size, size)


@settings(deadline=None)  # timing under a loaded machine is not the property
@given(
    size=st.integers(min_value=1, max_value=3000),
    chunk=st.integers(min_value=1, max_value=500),
    seed=st.integers(0, 99),
)
def test_gather_places_chunks_in_any_order(size: int, chunk: int, seed: int) -> None:
    data = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
    chunks = [
        pb.ReadBufferChunk(offset=100 + s, data=data[s : s + chunk].tobytes())
        for s in range(0, size, chunk)
    ]
    np.random.default_rng(seed).shuffle(chunks)  # type: ignore[arg-type]
    np.testing.assert_array_equal(_chunks.gather(chunks, 100, size), data)


def test_gather_refuses_short_and_stray_chunks() -> None:
    with pytest.raises(DataLoss, match="3 of 4"):
        _chunks.gather([pb.ReadBufferChunk(offset=0, data=b"abc")], 0, 4)
    with pytest.raises(DataLoss, match="outside"):
        _chunks.gather([pb.ReadBufferChunk(offset=2, data=b"abc")], 0, 4)


def test_as_bytes_is_little_endian_and_c_ordered() -> None:
    array = np.array([[1, 2], [3, 4]], dtype=">u2").T
    raw = _chunks.as_bytes(array, np.dtype(np.uint16))
    assert bytes(raw) == np.array([1, 3, 2, 4], "<u2").tobytes()


@pytest.mark.parametrize("size", [0, -1, _chunks.MAX_CHUNK_SIZE + 1])
def test_chunk_size_limits(size: int) -> None:
    with pytest.raises(InvalidArgument):
        _chunks.check_chunk_size(size)
    assert _chunks.check_chunk_size(_chunks.MAX_CHUNK_SIZE) == _chunks.MAX_CHUNK_SIZE
