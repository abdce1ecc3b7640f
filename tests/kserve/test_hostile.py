"""Hostile KServe callers: what one request or stream may cost the daemon is bounded."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from accyd.catalog import Catalog
from accyd.catalog.model import Pipeline
from accyd.doors.kserve.protocol import open_inference_pb2 as pb
from accyd.doors.kserve.protocol import open_inference_pb2_grpc
from accyd.doors.kserve.streams import STREAM_IN_FLIGHT, STREAM_UNSENT_BYTES
from accyd.doors.kserve.tensors import MAX_DIMS
from tests.kserve.harness import Door, simple_request
from tests.launch_service.harness import CATALOG, ServerThread, make_config

INTS = np.arange(16, dtype=np.int32)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    running = ServerThread(make_config(Path(tmp_path_factory.mktemp("hostile")), "tcp"))
    yield running
    running.stop()


def many_dims(count: int) -> pb.ModelInferRequest:
    """A ``simple`` request whose first input's shape has ``count`` dims, each 2."""
    request = simple_request(INTS, INTS)
    del request.inputs[0].shape[:]
    request.inputs[0].shape.extend([2] * count)
    return request


def test_a_shape_of_many_dims_is_refused_at_once_and_stalls_nobody(server: ServerThread) -> None:
    """60,000 dims were multiplied out on the event loop (quadratic, then a number too long
    to print: INTERNAL): another tenant's calls stalled for seconds."""
    attacker, victim = Door(server.address), Door(server.address)
    slowest = 0.0
    stop = threading.Event()

    def watch() -> None:
        nonlocal slowest
        while not stop.is_set():
            started = time.monotonic()
            victim("ServerLive", pb.ServerLiveRequest())
            slowest = max(slowest, time.monotonic() - started)
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for count in (60_000, 120_000):
            started = time.monotonic()
            error = attacker.refusal("ModelInfer", many_dims(count))
            took = time.monotonic() - started
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
            assert f"at most {MAX_DIMS} dims" in error.details()
            assert took < 0.5, f"{count} dims took {took:.2f} s to refuse"
    finally:
        stop.set()
        watcher.join()
    assert slowest < 0.5, f"another caller waited {slowest:.2f} s"
    attacker("ModelInfer", simple_request(INTS, INTS))  # the door still serves


@pytest.mark.parametrize(
    ("shape", "says"),
    [
        ([2] * 64, "1 to 1099511627776 bytes"),  # 2^64 elements, within the dims bound
        ([-1, 16], "negative dim"),
        ([0, 16], "1 to"),
        ([], "at most 64 dims"),
        ([(1 << 63) - 1] * 64, "1 to 1099511627776 bytes"),
    ],
)
def test_shapes_out_of_bounds_are_invalid_argument(
    server: ServerThread, shape: list[int], says: str
) -> None:
    request = simple_request(INTS, INTS)
    del request.inputs[0].shape[:]
    request.inputs[0].shape.extend(shape)
    error = Door(server.address).refusal("ModelInfer", request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert says in error.details()


def scan_request(count: int, ident: str) -> pb.ModelInferRequest:
    """A device_scan request of ``count`` floats (its answer is as large)."""
    request = pb.ModelInferRequest(model_name="accy.kernel.device_scan", id=ident)
    request.inputs.add(name="x", datatype="FP32", shape=[count])
    request.raw_input_contents.append(np.ones(count, np.float32).tobytes())
    return request


def inferences(door: Door, model: str) -> int:
    stats = door("ModelStatistics", pb.ModelStatisticsRequest(name=model))
    return int(stats.model_stats[0].inference_count)


def settled(read: Callable[[], int], quiet: float = 1.0, timeout: float = 20) -> int:
    """``read()`` once it has not changed for ``quiet`` seconds."""
    deadline = time.monotonic() + timeout
    last, since = read(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = read()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return now
    raise AssertionError(f"still moving after {timeout} s: {last}")


@pytest.mark.parametrize(
    ("answer_bytes", "total", "held"),
    [
        (1 << 20, 80, STREAM_IN_FLIGHT),  # small answers: the count bounds them
        (8 << 20, 24, STREAM_UNSENT_BYTES // (8 << 20)),  # large ones: the bytes do
    ],
)
def test_a_stream_that_is_never_read_stops_being_served(
    tmp_path: Path, answer_bytes: int, total: int, held: int
) -> None:
    """Answers queued without bound and each request's turn came back once its answer was
    queued: a caller that never read grew the daemon's memory by every answer."""
    running = ServerThread(make_config(tmp_path, "tcp"))
    model, count = "accy.kernel.device_scan", answer_bytes // 4
    door = Door(running.address)
    # No BDP probing: the caller's flow-control window stays its first size instead of
    # growing while answers arrive, so what gRPC writes unread stays within ``written``.
    door.channel = grpc.insecure_channel(
        running.address,
        options=[("grpc.max_receive_message_length", 1 << 25), ("grpc.http2.bdp_probe", 0)],
    )
    door.stub = open_inference_pb2_grpc.GRPCInferenceServiceStub(door.channel)
    stream = door.stub.ModelStreamInfer(scan_request(count, str(i)) for i in range(total))
    try:
        served = settled(lambda: inferences(door, model))
        # Answers not yet written are held (at most ``held``), and gRPC writes no more than
        # the caller's flow-control window takes (a few MiB).
        written = max(1, (4 << 20) // answer_bytes)
        assert served <= held + written, f"{served} of {total} served, none read"
        answered = {reply.infer_response.id for reply in itertools.islice(stream, total)}
        assert answered == {str(i) for i in range(total)}  # read now: every one comes
    finally:
        stream.cancel()
        door.close()
        running.stop()


def test_a_large_catalog_is_listed_and_searched_in_linear_time(tmp_path: Path) -> None:
    """RepositoryIndex found each pipeline's model among all of them (quadratic, on the event
    loop): 20,000 pipelines took past the 20 s deadline and stalled every other call."""
    simple = next(p for p in CATALOG.pipelines if p.target == "simple")
    many = [dataclasses.replace(simple, target=f"m{i:05}") for i in range(20_000)]
    catalog = Catalog(CATALOG.registry, [*CATALOG.pipelines, *many])
    running = ServerThread(make_config(tmp_path, "tcp"), catalog=catalog)
    door = Door(running.address)
    try:
        for ready in (False, True, False):
            started = time.monotonic()
            listed = door("RepositoryIndex", pb.RepositoryIndexRequest(ready=ready))
            took = time.monotonic() - started
            assert len(listed.models) == len(catalog.pipelines)
            assert took < 2.0, f"RepositoryIndex of 20,000 pipelines took {took:.1f} s"
        assert listed.models[-1].name == "simple" and listed.models[-1].state == "READY"
        found = simple_request(INTS, INTS)
        found.model_name = "m19999"
        door("ModelInfer", found)
        started = time.monotonic()
        for attempt in range(100):  # unknown names are not kept: each is looked up anew
            found.model_name = f"nope{attempt}"
            assert door.refusal("ModelInfer", found).code() == grpc.StatusCode.NOT_FOUND
        took = time.monotonic() - started
        assert took < 2.0, f"100 unknown models took {took:.1f} s"
    finally:
        door.close()
        running.stop()


def test_the_door_lists_and_finds_the_catalog_served_now(tmp_path: Path) -> None:
    """The door keeps what it found in a catalog (models by name, RepositoryIndex's answer):
    a catalog replaced (a reload) must not leave it answering from the old one."""
    simple = next(p for p in CATALOG.pipelines if p.target == "simple")
    catalog = Catalog(CATALOG.registry, [*CATALOG.pipelines, simple_as("m.gone", simple)])
    running = ServerThread(make_config(tmp_path, "tcp"), catalog=catalog)
    door = Door(running.address)
    try:
        gone = simple_request(INTS, INTS)
        gone.model_name = "m.gone"
        door("ModelInfer", gone)  # found, and kept
        listed = {m.name for m in door("RepositoryIndex", pb.RepositoryIndexRequest()).models}
        assert "m.gone" in listed and "m.new" not in listed
        replaced = Catalog(CATALOG.registry, [*CATALOG.pipelines, simple_as("m.new", simple)])
        running.call(asyncio.to_thread(running.server.daemon.replace_catalog, replaced))
        listed = {m.name for m in door("RepositoryIndex", pb.RepositoryIndexRequest()).models}
        assert "m.new" in listed and "m.gone" not in listed
        assert door.refusal("ModelInfer", gone).code() == grpc.StatusCode.NOT_FOUND
        gone.model_name = "m.new"
        door("ModelInfer", gone)
    finally:
        door.close()
        running.stop()


def simple_as(name: str, simple: Pipeline) -> Pipeline:
    return dataclasses.replace(simple, target=name)
