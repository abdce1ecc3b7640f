"""perf_analyzer (PyPI 2.60.0) over HTTP (``-i http``) against the built-in pipelines that
take no runtime scalar as a parameter (perf_analyzer sends request parameters over gRPC
only), shared memory off and on.

Each run sends 300 requests at concurrency 8 and must exit 0 by the binary's own status;
the daemon's launch counter moves by exactly the requests sent, and once perf_analyzer is
gone /dev/shm has no name more than before.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.kserve.harness import Tools, launches_total, shm_names
from tests.kserve_http.conftest import HttpDaemon

REQUESTS = 300
MODELS = {
    "simple": [],
    "accy.kernel.device_scan": ["--shape", "x:1000"],
    "accy.kernel.reduce_sum": ["--shape", "x:5000"],
}


@pytest.mark.parametrize("memory", ["none", "system"])
@pytest.mark.parametrize("model", list(MODELS))
def test_perf_analyzer_over_http(
    tools: Tools, plain_http: HttpDaemon, model: str, memory: str
) -> None:
    names = shm_names()
    before = launches_total(plain_http.daemon)
    done = subprocess.run(
        [str(tools.perf_analyzer), "-m", model, "-u", plain_http.http, "-i", "http",
         "--request-count", str(REQUESTS), "--concurrency-range", "8",
         "--shared-memory", memory, *MODELS[model]],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (
        f"perf_analyzer exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    )
    assert f"Request count: {REQUESTS}" in done.stdout, done.stdout
    assert "Server:" in done.stdout, done.stdout  # it read the statistics route
    assert launches_total(plain_http.daemon) - before == REQUESTS
    assert shm_names() <= names, f"left in /dev/shm: {shm_names() - names}"


def test_perf_analyzer_over_http_with_a_token(
    tools: Tools, guarded_http: HttpDaemon, http_tokens: tuple[Path, dict[str, str]]
) -> None:
    """Every call perf_analyzer makes (metadata, regions, infer, statistics) carries its
    ``-H`` header; the same run without it is refused."""
    command = [
        str(tools.perf_analyzer), "-m", "simple", "-u", guarded_http.http, "-i", "http",
        "--request-count", "100", "--concurrency-range", "2", "--shared-memory", "system",
    ]  # fmt: skip
    token = http_tokens[1]["alpha"]
    done = subprocess.run(
        [*command, "-H", f"authorization: Bearer {token}"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert "Request count: 100" in done.stdout, done.stdout
    refused = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode != 0
    assert "authorization" in refused.stdout + refused.stderr
