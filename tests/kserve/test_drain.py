"""The drain at shutdown and the KServe door: an open ModelStreamInfer does not hold it."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import grpc
import numpy as np

from accyd.catalog import load_catalog
from accyd.doors.kserve.protocol import open_inference_pb2 as pb
from tests.kserve.harness import Door, simple_request
from tests.launch_service.harness import ServerThread, details, make_config

SLOW_CATALOG = Path(__file__).parents[1] / "catalogs" / "slow"

GRACE = 8.0
INTS = np.arange(16, dtype=np.int32)


def test_an_idle_stream_does_not_hold_the_drain(tmp_path: Path) -> None:
    """tritonclient's ``start_stream()`` keeps one open: a stop waited out its whole grace."""
    running = ServerThread(make_config(tmp_path, "tcp", grace_seconds=GRACE))
    door = Door(running.address)
    outbox: queue.SimpleQueue[pb.ModelInferRequest | None] = queue.SimpleQueue()
    try:
        stream = door.stub.ModelStreamInfer(iter(outbox.get, None))
        outbox.put(simple_request(INTS, INTS))
        answer = next(stream)  # open, answered, and idle from now on
        assert not answer.error_message
        started = time.monotonic()
        running.stop()
        took = time.monotonic() - started
        assert took < 2.0, f"the stop took {took:.1f} s of its {GRACE} s grace"
        try:
            next(stream)
            raise AssertionError("the stream went on")
        except grpc.RpcError as error:  # it says why it ended, and what to do
            assert error.code() == grpc.StatusCode.UNAVAILABLE, error
            assert "shutting down" in str(error.details())
    finally:
        outbox.put(None)
        door.close()


def test_calls_running_past_the_grace_hear_why_on_a_loaded_loop(tmp_path: Path) -> None:
    """gRPC cancelled what still ran half a second after the grace, and a loop slowed by load
    had not yet answered those calls itself by then: they ended ``CANCELLED: CANCELLED``."""
    grace = 1.0
    catalog = load_catalog([SLOW_CATALOG])
    running = ServerThread(make_config(tmp_path, "tcp", grace_seconds=grace), catalog=catalog)
    doors = [Door(running.address) for _ in range(4)]
    answers: list[grpc.RpcError | object] = []

    def infer(door: Door) -> None:
        request = pb.ModelInferRequest(model_name="accy.test.slow")
        request.inputs.add(name="x", datatype="FP32", shape=[4])
        request.raw_input_contents.append(bytes(16))
        request.parameters["ms"].int64_param = 4000
        try:
            answers.append(door("ModelInfer", request))
        except grpc.RpcError as error:
            answers.append(error)

    callers = [threading.Thread(target=infer, args=(door,)) for door in doors]
    for caller in callers:
        caller.start()
    time.sleep(0.5)  # every call waits on the device now
    stopping = threading.Thread(target=running.stop)
    stopping.start()
    time.sleep(grace - 0.2)
    running.loop.call_soon_threadsafe(time.sleep, 1.0)  # the loop stalls over the deadline
    stopping.join(30)
    for caller in callers:
        caller.join(30)
    for door in doors:
        door.close()
    assert len(answers) == len(doors)
    for answer in answers:
        assert isinstance(answer, grpc.RpcError)
        assert answer.code() == grpc.StatusCode.UNAVAILABLE, (answer.code(), answer.details())
        assert "shutting down" in str(answer.details()), answer.details()
        assert details(answer)["ErrorInfo"].reason == "SHUTTING_DOWN"


def test_a_busy_stream_sends_what_it_runs_then_ends(tmp_path: Path) -> None:
    """The drain ends a stream's requests, not its answers: one running as the stop begins
    reaches its caller before the stream ends UNAVAILABLE."""
    catalog = load_catalog([SLOW_CATALOG])
    running = ServerThread(make_config(tmp_path, "tcp", grace_seconds=GRACE), catalog=catalog)
    door = Door(running.address)
    outbox: queue.SimpleQueue[pb.ModelInferRequest | None] = queue.SimpleQueue()
    try:
        stream = door.stub.ModelStreamInfer(iter(outbox.get, None))
        request = pb.ModelInferRequest(model_name="accy.test.slow", id="slow")
        request.inputs.add(name="x", datatype="FP32", shape=[4])
        request.raw_input_contents.append(bytes(16))
        request.parameters["ms"].int64_param = 1000
        outbox.put(request)
        time.sleep(0.3)  # it runs
        started = time.monotonic()
        running.stop()
        assert time.monotonic() - started < GRACE / 2
        answer = next(stream)
        assert answer.infer_response.id == "slow" and not answer.error_message
        try:
            next(stream)
            raise AssertionError("the stream went on")
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.UNAVAILABLE, error
    finally:
        outbox.put(None)
        door.close()
