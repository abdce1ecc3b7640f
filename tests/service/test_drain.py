"""The drain at shutdown: streams that last as long as their client do not hold it."""

from __future__ import annotations

import queue
import time
from pathlib import Path

import grpc

from accy.protocol.launch.v1 import launch_pb2 as pb
from tests.service.harness import ServerThread, attach, make_config

GRACE = 8.0


def test_an_idle_ring_stream_does_not_hold_the_drain(tmp_path: Path) -> None:
    """Every TCP client holds a RingStream open: a stop waits for its calls, not for it."""
    running = ServerThread(make_config(tmp_path, "tcp", grace_seconds=GRACE))
    channel = grpc.insecure_channel(running.address)
    outbox: queue.SimpleQueue[pb.RingFrame | None] = queue.SimpleQueue()
    try:
        client = attach(channel)
        outbox.put(pb.RingFrame(slots=64))
        stream = client.stub.RingStream(iter(outbox.get, None), metadata=client.metadata)
        assert next(stream).slots == 64  # open, and idle from now on
        started = time.monotonic()
        running.stop()
        took = time.monotonic() - started
        assert took < 2.0, f"the stop took {took:.1f} s of its {GRACE} s grace"
    finally:
        outbox.put(None)
        channel.close()
