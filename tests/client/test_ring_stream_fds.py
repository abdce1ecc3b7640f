"""A ring stream's eventfds are never read or written after they close: closing waits for
the sender that sleeps on them (a freed number is soon another descriptor of the process)."""

from __future__ import annotations

import os
import queue
import select
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from accy import _ring_stream
from accy._ring_stream import RingStreamLink
from accy.errors import AccyError
from accy.protocol.launch.v1 import launch_pb2 as pb


class Call:
    """A RingStream call: a thread takes the request iterator as gRPC's does."""

    def __init__(self, requests: Iterator[pb.RingFrame]) -> None:
        self.answers: queue.Queue[pb.RingState | None] = queue.Queue()
        self.answers.put(pb.RingState())  # the daemon took the ring
        self.consumer = threading.Thread(target=lambda: list(requests), daemon=True)
        self.consumer.start()

    def __iter__(self) -> Call:
        return self

    def __next__(self) -> pb.RingState:
        answer = self.answers.get()
        if answer is None:
            raise StopIteration
        return answer

    def cancel(self) -> None:
        self.answers.put(None)


class Stub:
    def __init__(self) -> None:
        self.calls: list[Call] = []

    def RingStream(self, requests: Iterator[pb.RingFrame], metadata: Any = ()) -> Call:
        self.calls.append(Call(requests))
        return self.calls[-1]


REAL_POLL = select.poll


class HeldPoll:
    """``select.poll`` whose first ``poll()`` waits until the test lets it go."""

    entered = threading.Event()
    release = threading.Event()

    def __init__(self) -> None:
        self._poll = REAL_POLL()

    def register(self, fd: int, events: int) -> None:
        self._poll.register(fd, events)

    def poll(self, timeout: float | None = None) -> list[tuple[int, int]]:
        HeldPoll.entered.set()
        assert HeldPoll.release.wait(10.0), "the test never let the sender go"
        return self._poll.poll(0)


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_close_waits_for_a_sender_asleep_on_the_eventfds(monkeypatch: pytest.MonkeyPatch) -> None:
    HeldPoll.entered.clear()
    HeldPoll.release.clear()
    monkeypatch.setattr(_ring_stream.select, "poll", HeldPoll)

    def translate(error: grpc.RpcError) -> AccyError:
        return AccyError(str(error))

    link = RingStreamLink(Stub(), [], translate, slots=16)  # type: ignore[arg-type]
    assert link.opened(5.0)
    assert HeldPoll.entered.wait(5.0), "the sender never went to sleep on its eventfds"
    submit = link._fds.submit
    link.close()
    # The sender still holds them: their numbers are not free for the next descriptor.
    assert is_open(submit)
    read_end, write_end = os.pipe()
    try:
        assert submit not in (read_end, write_end)
        os.write(write_end, b"sixteen bytes ok")
        HeldPoll.release.set()
        for _ in range(500):  # the sender wakes, reads its own eventfd, lets go: they close
            if not is_open(submit):
                break
            time.sleep(0.01)
        assert not is_open(submit), "the eventfds stayed open after the sender let go"
        assert os.read(read_end, 64) == b"sixteen bytes ok", "another descriptor was read"
    finally:
        os.close(read_end)
        os.close(write_end)
