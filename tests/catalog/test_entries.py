"""A kernel's ``entry`` must name a function of its code: refused when the catalog loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from accyd.backends.base import ArtifactRequest
from accyd.backends.host import HostBackend
from accyd.catalog import ArtifactFormat, load_catalog
from accyd.errors import CatalogError, FailedPrecondition
from tests.catalog.test_manifest import KERNEL, PIPELINE, write


def test_a_host_entry_that_names_no_function_is_refused_at_load(tmp_path: Path) -> None:
    folder = write(tmp_path, KERNEL.replace('entry = "copy"', 'entry = "cpoy"') + PIPELINE)
    with pytest.raises(CatalogError, match="no function 'cpoy'") as caught:
        load_catalog([folder])
    assert caught.value.field == "entry"
    assert "demo.kernel.copy" in caught.value.message


def test_host_code_that_is_not_python_is_refused_at_load(tmp_path: Path) -> None:
    broken = KERNEL.replace("def copy(grid", "def copy(grid,,")
    with pytest.raises(CatalogError, match="not valid Python"):
        load_catalog([write(tmp_path, broken + PIPELINE)])


def test_an_entry_bound_by_assignment_or_import_loads(tmp_path: Path) -> None:
    aliased = KERNEL.replace('entry = "copy"', 'entry = "alias"').replace(
        'code = "def copy', 'code = "alias = None\\ndef copy'
    )
    assert load_catalog([write(tmp_path, aliased + PIPELINE)]).find_pipeline("demo.copy")


def test_the_host_backend_refuses_a_missing_entry_as_a_failed_precondition() -> None:
    backend = HostBackend()
    try:
        request = ArtifactRequest(
            kernel_name="cpoy", format=ArtifactFormat.HOST_PY, argument_count=2,
            scalar_argument_count=1, payload="def copy(*args):\n    pass\n", origin="test",
        )  # fmt: skip
        artifact = backend.create_artifact(request)
        with pytest.raises(FailedPrecondition, match="'cpoy'") as caught:
            backend.load_artifact(artifact)
        assert caught.value.field == "entry"
    finally:
        backend.close()
