"""A catalog over the executor's test pipeline, and daemons on the recording and host backends."""

from __future__ import annotations

from typing import Any

from accyd.backends.host import HostBackend
from accyd.catalog import Catalog, load_catalog
from accyd.catalog.model import ArtifactFormat, Pipeline, Registry
from accyd.core.daemon import Daemon
from accyd.core.tenants import Quotas
from accyd.errors import NotFound
from accyd.testing import RecordingBackend
from tests.core.semantics_fixtures import TEST_PIPELINE, example_registry


class ExampleCatalog:
    """The executor's device_scan test pipeline, in the CUDA PTX format only."""

    def __init__(self) -> None:
        self.registry: Registry = example_registry()
        self.pipelines: tuple[Pipeline, ...] = (TEST_PIPELINE,)

    def find_pipeline(self, target: str, version: int = 0) -> Pipeline:
        if target != TEST_PIPELINE.target or version not in (0, TEST_PIPELINE.version):
            raise NotFound(f"no pipeline {target}", field="target")
        return TEST_PIPELINE

    def formats_of(self, pipeline: Pipeline) -> tuple[ArtifactFormat, ...]:
        return (ArtifactFormat.CUDA_PTX,)


def recording_daemon(
    quotas: Quotas | None = None, **options: Any
) -> tuple[Daemon, RecordingBackend]:
    backend = RecordingBackend()
    return Daemon(ExampleCatalog(), {0: backend}, quotas=quotas, **options), backend


def host_daemon(
    quotas: Quotas | None = None, catalog: Catalog | None = None, **options: Any
) -> tuple[Daemon, HostBackend]:
    backend = HostBackend()
    daemon = Daemon(catalog or load_catalog(), {0: backend}, quotas=quotas, **options)
    return daemon, backend
