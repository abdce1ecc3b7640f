"""A zeroed intermediate is zeros once, when made, and keeps what kernels leave in it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from accyd.backends.host import HostBackend
from accyd.catalog import ArtifactFormat, load_catalog
from accyd.core.executor import (
    PipelineLaunch,
    allocate_intermediates,
    launch_pipeline,
    load_pipeline_artifacts,
)

CATALOG = load_catalog([Path(__file__).parents[1] / "catalogs" / "state"], builtin=False)
PIPELINE = CATALOG.find_pipeline("accy.test.state.launches")


def test_a_session_scratch_counts_its_launches_from_zero() -> None:
    backend = HostBackend()
    count = backend.allocate_buffer(8)
    registry, host = CATALOG.registry, ArtifactFormat.HOST_PY
    with load_pipeline_artifacts(backend, PIPELINE, registry, host) as pool:
        for _ in range(2):  # each new scratch starts again from zero
            with allocate_intermediates(backend, PIPELINE, []) as scratch:
                seen = []
                for _ in range(3):
                    launch_pipeline(
                        backend,
                        PipelineLaunch(
                            PIPELINE, registry, host, results=[count],
                            intermediates=scratch.buffers, artifacts=pool,
                        ),
                    )  # fmt: skip
                    backend.synchronize()
                    seen.append(int(np.frombuffer(backend.read(count, 0, 8, None), "<u8")[0]))
                assert seen == [1, 2, 3]
    backend.destroy(count)
