"""Every door's launch counted once in accy_launches_total; process figures; Triton's names."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from accy import Client
from accy.protocol.launch.v1 import launch_pb2 as pb
from accy.protocol.launch.v1 import launch_pb2_grpc
from accyd.doors.kserve.protocol import open_inference_pb2_grpc
from tests.kserve.harness import simple_request
from tests.launch_service.harness import ServerThread, make_config
from tests.observability.test_metrics_endpoint import scrape
from tests.waiting import eventually

SAXPY = "accy.kernel.saxpy"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[ServerThread]:
    running = ServerThread(make_config(tmp_path, "unix", metrics_port=0))
    yield running
    running.stop()


def launched(samples: dict[str, float]) -> float:
    """Every launch the metric counted, of any pipeline and status."""
    return sum(v for k, v in samples.items() if k.startswith("accy_launches_total{"))


def saxpy_by(monkeypatch: pytest.MonkeyPatch, ring: str) -> Callable[[ServerThread], None]:
    def launch(served: ServerThread) -> None:
        monkeypatch.setenv("ACCY_RING", ring)
        with Client(served.address, client_name=f"ring-{ring}") as client:
            session = client.load(SAXPY)
            x = client.buffer(np.ones(64, np.float32))
            out = client.empty(64, "f32")
            session.launch([x, x], [out], wait=True, n=64, a=2.0)

    return launch


def run_rpc(served: ServerThread) -> None:
    with Client(served.address, client_name="run") as client:
        ones = np.ones(64, np.float32)
        (out,) = client.run(SAXPY, ones, ones, a=2.0)
    np.testing.assert_array_equal(out, np.full(64, 3.0, np.float32))


def kserve_infer(served: ServerThread) -> None:
    with grpc.insecure_channel(served.address) as channel:
        stub = open_inference_pb2_grpc.GRPCInferenceServiceStub(channel)
        a, b = np.arange(16), np.ones(16)
        stub.ModelInfer(simple_request(a, b), timeout=30)


DOORS = {
    "unary Launch": lambda mp: saxpy_by(mp, "0"),
    "ring": lambda mp: saxpy_by(mp, "1"),
    "ring over a stream": lambda mp: saxpy_by(mp, "stream"),
    "Run": lambda mp: run_rpc,
    "KServe ModelInfer": lambda mp: kserve_infer,
}


@pytest.mark.parametrize("door", list(DOORS))
def test_each_door_counts_its_launch_once(
    served: ServerThread, monkeypatch: pytest.MonkeyPatch, door: str
) -> None:
    before = launched(scrape(served))
    DOORS[door](monkeypatch)(served)
    # A ring's engine counts its launches as its slow thread looks (every 50 ms).
    assert eventually(lambda: launched(scrape(served)) == before + 1, timeout=2.0), (
        launched(scrape(served)) - before
    )
    assert launched(scrape(served)) == before + 1


def test_a_refused_run_is_counted_under_a_bounded_label(served: ServerThread) -> None:
    with grpc.insecure_channel(served.address) as channel:
        stub = launch_pb2_grpc.LaunchServiceStub(channel)  # the library checks targets first
        for target in ("no.such.pipeline", "another.one"):
            with pytest.raises(grpc.RpcError) as raised:
                stub.Run(pb.RunRequest(target=target), timeout=10)
            assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    samples = scrape(served)
    assert samples['accy_launches_total{pipeline="unknown",status="not_found"}'] == 2
    assert not [k for k in samples if "no.such.pipeline" in k]


def test_process_figures_are_exported(served: ServerThread) -> None:
    samples = scrape(served)
    for name in (
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
        "process_start_time_seconds",
    ):
        assert samples[name] > 0, name
    assert any(k.startswith("python_info{") for k in samples)
    assert any(k.startswith("python_gc_collections_total{") for k in samples)


def test_kserve_figures_under_triton_names(served: ServerThread) -> None:
    kserve_infer(served)
    kserve_infer(served)
    with grpc.insecure_channel(served.address) as channel:
        stub = open_inference_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError):  # inputs in a region never registered: failed
            stub.ModelInfer(simple_request(regions=[("nowhere", 0), ("nowhere", 64)]), timeout=30)
    samples = scrape(served)
    labels = '{model="simple",version="1"}'
    assert samples[f"nv_inference_request_success{labels}"] == 2
    assert samples[f"nv_inference_request_failure{labels}"] == 1
    assert samples[f"nv_inference_count{labels}"] == 2
    assert samples[f"nv_inference_exec_count{labels}"] == 2
    for figure in ("request", "queue", "compute_input", "compute_infer", "compute_output"):
        assert f"nv_inference_{figure}_duration_us{labels}" in samples, figure
    request_us = samples[f"nv_inference_request_duration_us{labels}"]
    infer_us = samples[f"nv_inference_compute_infer_duration_us{labels}"]
    assert 0 < infer_us <= request_us
    # Exactly Triton's names: no _total suffix added to them.
    assert not [k for k in samples if re.match(r"nv_\w+_total", k)]
