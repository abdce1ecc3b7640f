"""Launches made with wait=False: sent without waiting, in order, bounded, refusals reported.

Pipelined launches are ring records: these run against the service double's
RingStream (the double's unary path answers each launch before the next).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest

from accy import errors
from accy.client import Client
from accy.protocol.ring import RING_ENV
from accy.testing import running_daemon, transport_of
from tests.client.fake_daemon import FakeLaunchService, until

SCAN = "accy.kernel.device_scan"
SAXPY = "accy.kernel.saxpy"
TOO_MANY = 2**31
"""An ``n`` a u32 holds and the pipeline's bounds refuse: refused by the daemon, not here."""


@pytest.fixture
def ringed(fake: tuple[str, FakeLaunchService]) -> tuple[str, FakeLaunchService]:
    fake[1].rings = True
    return fake


@pytest.fixture
def client(ringed: tuple[str, FakeLaunchService]) -> Iterator[Client]:
    with Client(ringed[0], client_name="pipelined") as made:
        yield made


def launched(service: FakeLaunchService) -> list[int]:
    return [request.runtime_scalars["n"].u32 for request in service.state.launches]


def test_a_launch_without_wait_returns_before_its_answer(
    ringed: tuple[str, FakeLaunchService], client: Client
) -> None:
    service = ringed[1]
    session = client.load(SCAN)
    x, y = client.buffer(np.ones(8, np.float32)), client.empty(8, "f32")
    service.answer_delay = 0.3
    started = time.monotonic()
    launches = [session.launch([x], [y], wait=False, n=8) for _ in range(3)]
    assert time.monotonic() - started < 0.3  # three answers take 0.9 s to come
    assert "enqueued" in repr(launches[0]) and transport_of(client).path == "ring-stream"
    session.wait()
    records = [launch.record for launch in launches]
    assert records == sorted(records) and len(set(records)) == 3
    assert len(service.state.launch_ids) == 3
    assert all(launch.wait() is launch and launch.completed for launch in launches)


def test_pipelined_launches_keep_their_order(
    ringed: tuple[str, FakeLaunchService], client: Client
) -> None:
    service = ringed[1]
    session = client.load(SCAN)
    x, y = client.buffer(np.arange(64, dtype=np.float32)), client.empty(64, "f32")
    launches = [session.launch([x], [y], wait=False, n=n) for n in range(1, 65)]
    session.wait()
    assert launched(service) == list(range(1, 65))
    assert [launch.record for launch in launches] == list(
        range(launches[0].record or 0, (launches[0].record or 0) + 64)
    )
    # A read after launches not waited for sees their results.
    np.testing.assert_array_equal(y.read(), np.cumsum(np.arange(64, dtype=np.float32)))


def test_a_refusal_nobody_waited_for_is_raised_by_the_next_launch(
    ringed: tuple[str, FakeLaunchService], client: Client
) -> None:
    service = ringed[1]
    session = client.load(SCAN)
    x, y = client.buffer(np.ones(8, np.float32)), client.empty(8, "f32")
    bad = session.launch([x], [y], wait=False, n=TOO_MANY)
    until(lambda: len(service.state.launches) == 1)
    time.sleep(0.2)  # its entry is back
    with pytest.raises(errors.InvalidArgument) as caught:
        session.launch([x], [y], n=8)
    message = str(caught.value)
    assert f"ring record {bad.record}" in message and session.id in message
    assert caught.value.metadata["record"] == str(bad.record)
    assert "was not sent" in message and caught.value.fields == ("runtime_scalars[n]",)
    assert len(service.state.launches) == 1  # the launch that raised it was not sent
    # Reported once: the session works on, and its wait does not raise it again.
    session.launch([x], [y], n=8)
    session.wait()
    assert launched(service) == [TOO_MANY, 8]


def test_a_refusal_nobody_waited_for_is_raised_by_session_wait(
    ringed: tuple[str, FakeLaunchService], client: Client
) -> None:
    service = ringed[1]
    session = client.load(SCAN)
    x, y = client.buffer(np.ones(8, np.float32)), client.empty(8, "f32")
    service.answer_delay = 0.1
    session.launch([x], [y], wait=False, n=8)
    bad = session.launch([x], [y], wait=False, n=TOO_MANY)
    session.launch([x], [y], wait=False, n=8)
    with pytest.raises(errors.InvalidArgument) as caught:
        session.wait()  # no sleep: the wait itself sees the entry
    assert f"ring record {bad.record} was refused: launch of session {session.id}" in str(
        caught.value
    )
    assert caught.value.metadata["record"] == str(bad.record)
    session.wait()  # reported once


def test_launch_wait_reports_its_own_refusal_once(
    ringed: tuple[str, FakeLaunchService], client: Client
) -> None:
    session = client.load(SCAN)
    x, y = client.buffer(np.ones(8, np.float32)), client.empty(8, "f32")
    bad = session.launch([x], [y], wait=False, n=TOO_MANY)
    with pytest.raises(errors.InvalidArgument) as caught:
        bad.wait()
    # Its own error first (it is the launch the caller waits on), its record at the end.
    message = caught.value.message
    assert message.startswith("launch of session") and "was refused" not in message
    assert message.endswith(f"(ring record {bad.record})")
    session.wait()  # already reported by the launch's own wait
    with pytest.raises(errors.InvalidArgument) as caught:
        session.launch([x], [y], n=TOO_MANY)  # waited at once: the same
    assert caught.value.message.startswith("launch of session")


def test_the_window_blocks_the_next_launch(
    ringed: tuple[str, FakeLaunchService], client: Client
) -> None:
    service = ringed[1]
    client.launch_window = 16  # the ring over the stream holds 16 records not done
    assert client.launch_window == 16
    session = client.load(SCAN)
    x, y = client.buffer(np.ones(8, np.float32)), client.empty(8, "f32")
    session.launch([x], [y], n=8)  # opens the ring; its binds are done
    service.answer_delay = 0.3
    started = time.monotonic()
    for _ in range(16):
        session.launch([x], [y], wait=False, n=8)
    assert time.monotonic() - started < 0.25
    session.launch([x], [y], wait=False, n=8)  # 16 not done: waits for the first to be done
    assert time.monotonic() - started >= 0.25
    with pytest.raises(errors.DeadlineExceeded, match=f"session {session.id} was not sent"):
        session.launch([x], [y], wait=False, n=8, timeout=0.05)
    service.answer_delay = 0.0
    session.wait()
    assert len(service.state.launches) == 18
    with pytest.raises(ValueError, match="launch_window"):
        client.launch_window = 0


def test_nothing_sent_is_lost_when_the_client_closes(ringed: tuple[str, FakeLaunchService]) -> None:
    service = ringed[1]
    service.launch_delay = 0.02
    with Client(ringed[0], client_name="closer") as client:
        session = client.load(SCAN)
        x, y = client.buffer(np.ones(8, np.float32)), client.empty(8, "f32")
        for _ in range(20):
            session.launch([x], [y], wait=False, n=8)
    assert len(service.state.launches) == 20


@pytest.mark.parametrize("way", ["ring-stream", "unary"])
def test_pipelined_launches_over_tcp_on_a_real_daemon(
    way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if way == "unary":
        monkeypatch.setenv(RING_ENV, "0")
    n, count = 64, 500
    with (
        running_daemon(backend="host") as daemon,
        Client(daemon.tcp_target, client_name="pipelined", launch_window=16) as client,
    ):
        x = client.buffer(np.ones(n, np.float32))
        y = client.buffer(np.zeros(n, np.float32))
        session = client.load(SAXPY)
        for _ in range(count):  # y = 0.5 * x + y, in place: every launch depends on the last
            session.launch([x, y], [y], wait=False, n=n, a=0.5)
        np.testing.assert_array_equal(y.read(), np.full(n, count * 0.5, np.float32))
        assert transport_of(client).path == way
        with pytest.raises(errors.AccyError) as caught:  # the daemon refuses: y holds n
            session.launch([x, y], [y], wait=False, n=n + 1, a=1.0)
            session.wait()  # through a ring, the refusal comes back later, naming the record
        assert caught.value.fields == ("runtime_scalars.n",) or "n" in str(caught.value)
        if way == "ring-stream":
            assert "ring record" in str(caught.value)
