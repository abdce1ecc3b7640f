"""perf_analyzer (PyPI 2.60.0) against every built-in pipeline, shared memory off and on.

Each run sends 300 requests at concurrency 8 over TCP and must exit 0 by the binary's own
status. The daemon's launch counter moves by exactly the requests sent, and once
perf_analyzer is gone the daemon holds the descriptors it held before (its regions closed
with its client) and /dev/shm has no name more than before.
"""

from __future__ import annotations

import subprocess

import pytest

from accy.testing import RunningDaemon
from tests.kserve.harness import (
    Tools,
    descriptors,
    launches_total,
    loopback_clients,
    shm_names,
    url_of,
    wait_until,
)

REQUESTS = 300
MODELS = {
    "simple": [],
    "accy.kernel.saxpy": [
        "--shape",
        "x:1000",
        "--shape",
        "y:1000",
        "--request-parameter",
        "a:2:int",
    ],
    "accy.kernel.device_scan": ["--shape", "x:1000"],
    "accy.kernel.reduce_sum": ["--shape", "x:5000"],
}


@pytest.mark.parametrize("memory", ["none", "system"])
@pytest.mark.parametrize("model", list(MODELS))
def test_perf_analyzer(tools: Tools, plain: RunningDaemon, model: str, memory: str) -> None:
    url = url_of(plain, "tcp")
    subprocess.run(  # warm: the model's session and kernels exist before the baseline
        [str(tools.perf_analyzer), "-m", model, "-u", url, "-i", "grpc", "--request-count", "8",
         "--concurrency-range", "1", *MODELS[model]],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    wait_until(lambda: _settled(plain), what="the warm-up's client dropped")
    fds, names = descriptors(plain), shm_names()
    before = launches_total(plain)
    done = subprocess.run(
        [str(tools.perf_analyzer), "-m", model, "-u", url, "-i", "grpc",
         "--request-count", str(REQUESTS), "--concurrency-range", "8",
         "--shared-memory", memory, *MODELS[model]],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (
        f"perf_analyzer exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    )
    assert f"Request count: {REQUESTS}" in done.stdout, done.stdout
    assert launches_total(plain) - before == REQUESTS
    wait_until(
        lambda: _settled(plain) and descriptors(plain) == fds, what="descriptors at baseline"
    )
    assert shm_names() <= names, f"left in /dev/shm: {shm_names() - names}"


def _settled(daemon: RunningDaemon) -> bool:
    """Every KServe client of a loopback caller has been dropped (its connections closed)."""
    return loopback_clients(daemon) == 0
