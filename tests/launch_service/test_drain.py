"""The drain at shutdown: streams that last as long as their client do not hold it."""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from accy import Client
from accy.protocol.launch.v1 import launch_pb2 as pb
from accy.testing import transport_of
from accyd.ring.engine import pyloop
from tests.launch_service.harness import ServerThread, attach, make_config

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


def eventfds() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += "eventfd" in os.readlink(f"/proc/self/fd/{fd}")
    return count


def test_ring_streams_of_clients_that_come_and_go_leave_nothing_behind(tmp_path: Path) -> None:
    """The stream's end (the client gone, the call cancelled meanwhile) lets its ring go: a
    cancel that cut the engine's release short leaked two descriptors per TCP client."""
    running = ServerThread(make_config(tmp_path, "tcp"))
    try:
        baseline = eventfds()
        for _ in range(6):
            with Client(running.address) as client, client.load("accy.kernel.saxpy") as saxpy:
                x = client.buffer(np.ones(16, np.float32))
                saxpy.launch(operands=[x, x], results=[x], n=16, a=1.0)
                assert transport_of(client).path == "ring-stream"
        deadline = time.monotonic() + 10
        while eventfds() > baseline and time.monotonic() < deadline:
            time.sleep(0.05)
        assert eventfds() <= baseline, f"{eventfds() - baseline} descriptors left behind"
    finally:
        running.stop()


def test_a_launch_that_ends_as_the_drain_begins_reaches_its_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The device going idle is not the end of a ring's launch: its end is written to the
    ring a moment after (here half a second, as on a loaded machine). A drain that detached
    the client first had it count the launch "lost when the daemon detached this client"."""
    monkeypatch.setenv("ACCY_RING", "1")
    monkeypatch.setenv("ACCYD_ENGINE", "python")
    seen: dict[int, float] = {}
    real_over = pyloop._over

    def late_over(mark: Any) -> bool:
        if not real_over(mark):
            return False
        return time.monotonic() - seen.setdefault(id(mark), time.monotonic()) >= SETTLE_LAG_S

    monkeypatch.setattr(pyloop, "_over", late_over)
    running = ServerThread(make_config(tmp_path, "unix", grace_seconds=GRACE))
    stopping = None
    try:
        with Client(running.address) as client:
            saxpy = client.load("accy.kernel.saxpy")
            x = client.buffer(np.ones(16, np.float32))
            y = client.empty(16, np.float32)
            saxpy.launch(operands=[x, x], results=[y], n=16, a=1.0)  # the ring is open
            launched = saxpy.launch(operands=[x, x], results=[y], n=16, a=2.0, wait=False)
            assert transport_of(client).path == "ring"
            time.sleep(0.1)  # taken, and run: the device is idle before the stop begins
            stopping = threading.Thread(target=running.stop)
            stopping.start()
            launched.wait()  # finished, not lost (a read now would be: the daemon is going)
    finally:
        if stopping is None:
            running.stop()
        else:
            stopping.join(GRACE + 10)


SETTLE_LAG_S = 0.5
