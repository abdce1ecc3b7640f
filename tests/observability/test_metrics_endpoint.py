"""Prometheus metrics of a live server, and GetStatus reporting the same numbers."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from accy import Client
from accy.errors import AccyError
from accy.protocol.launch.v1 import launch_pb2 as pb
from accy.testing import transport_of
from accyd.core.tenants import Quotas
from accyd.errors import LaunchArgumentMismatch, NotFound
from accyd.telemetry.metrics import Metrics, RingLaunchCounts
from tests.launch_service.harness import ServerThread, make_config
from tests.security.harness import Caller
from tests.waiting import eventually

SCAN = "accy.kernel.device_scan"
SAXPY = "accy.kernel.saxpy"


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ServerThread]:
    monkeypatch.setenv("ACCYD_SUPERVISOR_RESTARTS", "2")
    monkeypatch.setenv("ACCYD_SUPERVISOR_DEVICE_FAULTS", "1")
    running = ServerThread(make_config(tmp_path, "unix", metrics_port=0, quotas=Quotas(buffers=2)))
    yield running
    running.stop()


def scrape(server: ServerThread) -> dict[str, float]:
    port = server.server.metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        match = re.match(r"^(\S+) (\S+)$", line)
        if match and not line.startswith("#"):
            samples[match[1]] = float(match[2])
    return samples


def test_the_endpoint_and_get_status_show_the_same_numbers(served: ServerThread) -> None:
    with grpc.insecure_channel(served.address) as channel:
        caller = Caller(channel)
        caller.attach()
        caller.load(SCAN)
        caller.buffer(4096)
        caller.buffer(1024)
        with pytest.raises(grpc.RpcError):
            caller.buffer(64)  # past the buffers quota
        samples = scrape(served)
        status = caller.status()
        caller.detach()
    assert samples["accy_clients"] == status.clients == 1
    assert samples["accy_sessions"] == status.sessions == 1
    assert samples["accy_buffers"] == status.buffers == 2
    (tenant,) = status.tenants
    assert samples['accy_device_memory_bytes{tenant="local"}'] == tenant.memory_bytes == 5120
    refusals = 'accy_quota_refusals_total{quota="buffers",tenant="local"}'
    assert samples[refusals] == status.quota_refusals == tenant.quota_refusals["buffers"] == 1
    assert samples["accy_restarts"] == status.restarts == 2
    assert samples["accy_device_faults_total"] == status.device_faults == 1


def test_a_server_without_a_metrics_port_serves_none(tmp_path: Path) -> None:
    running = ServerThread(make_config(tmp_path, "unix"))
    try:
        assert running.server.metrics_port is None
    finally:
        running.stop()


def test_observe_launch_counts_by_pipeline_and_status() -> None:
    metrics = Metrics()
    metrics.observe_launch(SCAN, 0.0003, waited=True)
    metrics.observe_launch(SCAN, 0.0001, waited=False)
    metrics.observe_launch(SCAN, 0.0001, waited=False, error=LaunchArgumentMismatch("no"))
    metrics.observe_launch(SCAN, 0.0001, waited=False, error=RuntimeError("bug"))
    text = metrics.render()
    for status, count in (("ok", 2), ("launch_argument_mismatch", 1), ("internal", 1)):
        assert f'accy_launches_total{{pipeline="{SCAN}",status="{status}"}} {count}.0' in text
    assert f'accy_launch_seconds_count{{pipeline="{SCAN}",waited="true"}} 1.0' in text
    assert f'accy_launch_seconds_count{{pipeline="{SCAN}",waited="false"}} 1.0' in text


def test_launches_through_the_service_are_counted(served: ServerThread) -> None:
    with grpc.insecure_channel(served.address) as channel:
        caller = Caller(channel)
        caller.attach()
        session = caller.load(SCAN)
        x, y = caller.buffer(4096), caller.buffer(4096)
        scalars = {"n": pb.Scalar(u32=1024)}
        request = pb.LaunchRequest(
            session_id=session, operands=[x], results=[y], runtime_scalars=scalars, wait=True
        )
        caller.Launch(request)
        caller.detach()
    samples = scrape(served)
    assert samples[f'accy_launches_total{{pipeline="{SCAN}",status="ok"}}'] == 1
    assert samples[f'accy_launch_seconds_count{{pipeline="{SCAN}",waited="true"}}'] == 1


@pytest.mark.parametrize("ring", ["1", "stream"])
def test_ring_launches_are_counted_by_pipeline_and_status(
    served: ServerThread, monkeypatch: pytest.MonkeyPatch, ring: str
) -> None:
    """Launches through either kind of ring count as launches: those enqueued as ``ok``
    (replayed runs by their length), a refused record under its reason."""
    monkeypatch.setenv("ACCY_RING", ring)
    with Client(served.address, client_name="counted") as client:
        session = client.load(SAXPY)
        x = client.buffer(np.ones(64, np.float32))  # the tenant's quota is two buffers
        out = client.empty(64, "f32")
        for _ in range(40):  # bound after the first: the rest replayed in runs
            session.launch([x, x], [out], wait=False, n=64, a=2.0)
        session.launch([x, x], [out], wait=False, n=65, a=2.0)  # more than x holds: refused
        with pytest.raises(AccyError) as raised:
            session.wait()
        assert raised.value.reason == "LAUNCH_ARGUMENT_MISMATCH"
        session.launch([x, x], [out], wait=True, n=64, a=1.0)
        np.testing.assert_array_equal(out.read(), np.full(64, 2.0, np.float32))
        assert transport_of(client).path == ("ring-stream" if ring == "stream" else "ring")
    ok = f'accy_launches_total{{pipeline="{SAXPY}",status="ok"}}'
    # The engine's own launches are counted as its slow thread looks, every 50 ms.
    assert eventually(lambda: scrape(served).get(ok) == 41, timeout=2.0), scrape(served).get(ok)
    samples = scrape(served)
    mismatch = f'accy_launches_total{{pipeline="{SAXPY}",status="launch_argument_mismatch"}}'
    assert samples[mismatch] == 1


def test_ring_launch_counts_name_an_unknown_session_so() -> None:
    metrics = Metrics()
    counts = RingLaunchCounts(metrics, lambda client, session: SCAN)
    counts.launched("c", "s1", 16)
    counts.launched("c", "s1", 3)
    counts.refused("c", None, NotFound("no session bound to handle 9"))
    text = metrics.render()
    assert f'accy_launches_total{{pipeline="{SCAN}",status="ok"}} 19.0' in text
    assert 'accy_launches_total{pipeline="unknown",status="not_found"} 1.0' in text
