"""Hostile KServe callers: what one request or stream may cost the daemon is bounded."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from accyd.doors.kserve.protocol import open_inference_pb2 as pb
from accyd.doors.kserve.tensors import MAX_DIMS
from tests.kserve.harness import Door, simple_request
from tests.service.harness import ServerThread, make_config

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
