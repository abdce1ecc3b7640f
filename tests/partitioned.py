"""A pytest plugin for a GPU machine: the suites with every CUDA stream in an SM partition.

``python -m pytest -p tests.partitioned tests/backends tests/engine tests/ring ...`` makes
each ``CudaBackend`` split its device's SMs into one partition as it opens (a green context
of ``ACCY_SUITE_PARTITION_SHARE`` of the SMs, default 0.5) and make every stream that asks
for none in it: the launch path runs as a confined tenant's would (graphs captured in the
partition, ring launches on its streams). A backend that cannot make it fails the test that
opened it, naming why: a run meant to be partitioned never passes unconfined. The tests of
partitions themselves, which split the SMs their own way, are skipped, and so are the device
launcher's own: the daemon runs it on the whole device only and never hands it a launch that
runs in a partition (``device_launchable``), which the ring suite's ``cuda-device`` cases
check here; driven into a partition by hand, its device-side graph launches never ran
(H100, driver 580.159.04, 2026-12-07).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

NAME = "suite"
SKIPPED = {
    "tests/backends/test_cuda_partitions.py": "splits the SMs its own way; the suite's "
    "partition is made",
    "tests/backends/test_device_launcher.py": "the device launcher runs on the whole device only",
}
"""Test files the partitioned run skips (their node ids' prefix), and why."""
_MADE = pytest.StashKey[list[str]]()
"""The size of each partition made, one entry per ``CudaBackend`` opened."""


def _share() -> float:
    share = float(os.environ.get("ACCY_SUITE_PARTITION_SHARE", "0.5"))
    if not 0.0 < share < 1.0:
        raise pytest.UsageError(f"ACCY_SUITE_PARTITION_SHARE={share}: give a share in (0, 1)")
    return share


def pytest_configure(config: pytest.Config) -> None:
    from accyd.backends.cuda.backend import CudaBackend
    from accyd.backends.partitions import PartitionSpec

    share = _share()
    opened: Callable[..., None] = CudaBackend.__init__
    made_stream: Callable[..., Any] = CudaBackend.create_stream
    config.stash[_MADE] = []

    def open_split(self: CudaBackend, *args: Any, **kwargs: Any) -> None:
        opened(self, *args, **kwargs)
        split = self.split_sms([PartitionSpec(NAME, share=share)])
        if split.unconfined:
            self.close()
            raise RuntimeError(f"the suite's partition was not made: {split.unconfined}")
        config.stash[_MADE].append(f"{split.sms_of(NAME)} of {split.total_sms} SMs")

    def stream_in_partition(
        self: CudaBackend, partition: str | None = None, priority: int = 0
    ) -> Any:
        return made_stream(self, NAME if partition is None else partition, priority)

    CudaBackend.__init__ = open_split  # type: ignore[method-assign]
    CudaBackend.create_stream = stream_in_partition  # type: ignore[method-assign]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        reason = next((why for file, why in SKIPPED.items() if item.nodeid.startswith(file)), None)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    made = config.stash.get(_MADE, [])
    sizes = sorted(set(made))
    terminalreporter.write_line(
        f"partitioned run: {len(made)} CUDA backends opened in a partition ({', '.join(sizes)})"
    )
