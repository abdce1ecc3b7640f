"""The drain at shutdown and the KServe door: an open ModelStreamInfer does not hold it."""

from __future__ import annotations

import queue
import time
from pathlib import Path

import grpc
import numpy as np

from accyd.doors.kserve.protocol import open_inference_pb2 as pb
from tests.kserve.harness import Door, simple_request
from tests.service.harness import ServerThread, make_config

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
