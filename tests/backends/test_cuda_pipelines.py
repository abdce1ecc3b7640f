"""The built-in pipelines through the executor on the CUDA backend, against float64 numpy.

Device memory in use returns to its starting value once pools, intermediates and
buffers are closed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from accyd.backends.cuda import cuda_available
from accyd.backends.cuda.backend import CudaBackend
from accyd.catalog import ArtifactFormat, load_catalog
from tests.pipeline_harness import CASES, SIZES, run_case

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not cuda_available(), reason="no CUDA driver or device here"),
]

CATALOG = load_catalog()
CUDA_SIZES = (*SIZES, 2**28 + 7)


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CudaBackend]:
    be = CudaBackend(0, cache_dir=tmp_path_factory.mktemp("kernel-cache"))
    yield be
    be.close()


@pytest.mark.parametrize("target", sorted(CASES))
@pytest.mark.parametrize("n", CUDA_SIZES)
@pytest.mark.parametrize("pooled", [False, True], ids=["owned", "pooled"])
def test_builtin_pipeline_on_cuda(backend: CudaBackend, target: str, n: int, pooled: bool) -> None:
    if n > 2**20 and not pooled:
        pytest.skip("the largest size runs pooled only (the owned path is the same kernels)")
    baseline = backend.memory_in_use()
    free_before, _ = backend.device_memory_info()
    error = run_case(
        backend,
        CATALOG,
        ArtifactFormat.CUDA_CPP,
        CASES[target],
        n,
        seed=n * 7 + pooled,
        pooled=pooled,
    )
    assert error < CASES[target].tolerance
    assert backend.memory_in_use() == baseline
    free_after, _ = backend.device_memory_info()
    assert free_after >= free_before - (64 << 20)


def test_formats_of_builtin_pipelines_include_cuda() -> None:
    for target in CASES:
        assert ArtifactFormat.CUDA_CPP in CATALOG.formats_of(CATALOG.find_pipeline(target))
