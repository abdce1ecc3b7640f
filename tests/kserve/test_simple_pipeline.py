"""The built-in ``simple`` pipeline (Triton's example model) on the host and CUDA backends:
sum and difference of 16 int32, wrapping as two's complement does."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from accyd.backends.base import Backend
from accyd.backends.cuda import cuda_available
from accyd.backends.host import HostBackend
from accyd.catalog import ArtifactFormat, load_catalog
from accyd.core.executor import PipelineLaunch, launch_pipeline

CATALOG = load_catalog()
I32 = np.iinfo(np.int32)


@pytest.fixture(params=["host", pytest.param("cuda", marks=pytest.mark.cuda)])
def backend(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Backend, ArtifactFormat]]:
    if request.param == "host":
        made: Backend = HostBackend()
        fmt = ArtifactFormat.HOST_PY
    else:
        if not cuda_available():
            pytest.skip("no CUDA driver or device here")
        from accyd.backends.cuda.backend import CudaBackend

        made = CudaBackend(0, cache_dir=tmp_path_factory.mktemp("kernel-cache"))
        fmt = ArtifactFormat.CUDA_CPP
    yield made, fmt
    made.close()


def test_simple_sums_and_differences(backend: tuple[Backend, ArtifactFormat]) -> None:
    device, fmt = backend
    pipeline = CATALOG.find_pipeline("simple")
    a = np.array([0, 1, -1, I32.max, I32.min, 7, *range(10)], dtype=np.int32)
    b = np.array([5, -1, 1, 1, 1, -7, *range(10, 0, -1)], dtype=np.int32)
    buffers = [device.allocate_buffer(64) for _ in range(4)]
    try:
        device.write(buffers[0], 0, a.tobytes(), None)
        device.write(buffers[1], 0, b.tobytes(), None)
        launch_pipeline(
            device, PipelineLaunch(pipeline, CATALOG.registry, fmt, buffers[:2], buffers[2:], ())
        )
        total = np.frombuffer(device.read(buffers[2], 0, 64, None), dtype=np.int32)
        difference = np.frombuffer(device.read(buffers[3], 0, 64, None), dtype=np.int32)
    finally:
        for buffer in buffers:
            device.destroy(buffer)
    with np.errstate(over="ignore"):
        assert np.array_equal(total, a + b)
        assert np.array_equal(difference, a - b)
    assert total[3] == I32.min and difference[4] == I32.max  # wrapped
