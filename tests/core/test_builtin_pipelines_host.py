"""The built-in pipelines on the host backend match float64 numpy at every size, and free all."""

from __future__ import annotations

import pytest

from accyd.backends.host import HostBackend
from accyd.catalog import ArtifactFormat, load_catalog
from tests.pipeline_harness import CASES, SIZES, run_case

CATALOG = load_catalog()


@pytest.fixture
def backend() -> HostBackend:
    backend = HostBackend()
    yield backend  # type: ignore[misc]
    backend.close()


@pytest.mark.parametrize("target", sorted(CASES))
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("pooled", [False, True], ids=["owned", "pooled"])
def test_builtin_pipeline_matches_float64_reference(
    backend: HostBackend, target: str, n: int, pooled: bool
) -> None:
    baseline = backend.memory_in_use()
    error = run_case(
        backend,
        CATALOG,
        ArtifactFormat.HOST_PY,
        CASES[target],
        n,
        seed=n * 7 + pooled,
        pooled=pooled,
    )
    assert error < CASES[target].tolerance
    assert backend.memory_in_use() == baseline
