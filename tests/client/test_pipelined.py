"""Launches made with wait=False: sent without waiting, in order, bounded, refusals reported."""

from __future__ import annotations

import time

import numpy as np
import pytest

from accy import errors
from accy.client import Client, Launch
from accy.protocol.ring import RING_ENV
from accy.testing import running_daemon
from tests.client.fake_daemon import FakeLaunchService, until

SCAN = "accy.kernel.device_scan"
SAXPY = "accy.kernel.saxpy"


def tag_of(launch: Launch) -> int:
    """The number errors name a launch made without waiting by (before its answer is read)."""
    sent = launch._sent
    assert sent is not None
    return sent.tag


def test_a_launch_without_wait_returns_before_its_answer(
    fake: tuple[str, FakeLaunchService], client: Client
) -> None:
    service = fake[1]
    session = client.load(SCAN)
    x, y = client.buffer(np.ones(8, np.float32)), client.empty(8, "f32")
    service.answer_delay = 0.3
    started = time.monotonic()
    launches = [session.launch([x], [y], wait=False, n=8) for _ in range(3)]
    assert time.monotonic() - started < 0.3  # three answers take 0.9 s to come
    assert "sent" in repr(launches[0])
    session.wait()
    assert [launch.id for launch in launches] == service.state.launch_ids
    assert all(launch.wait() is launch and launch.completed for launch in launches)


def test_pipelined_launches_keep_their_order(
    fake: tuple[str, FakeLaunchService], client: Client
) -> None:
    service = fake[1]
    session = client.load(SCAN)
    x, y = client.buffer(np.arange(64, dtype=np.float32)), client.empty(64, "f32")
    launches = [session.launch([x], [y], wait=False, n=n) for n in range(1, 65)]
    session.wait()
    assert [r.runtime_scalars["n"].u32 for r in service.state.launches] == list(range(1, 65))
    assert [launch.id for launch in launches] == service.state.launch_ids
    # A read after launches not waited for sees their results.
    np.testing.assert_array_equal(y.read(), np.cumsum(np.arange(64, dtype=np.float32)))


def test_a_refusal_nobody_waited_for_is_raised_by_the_next_launch(
    fake: tuple[str, FakeLaunchService], client: Client
) -> None:
    service = fake[1]
    session = client.load(SCAN)
    x, y = client.buffer(np.ones(8, np.float32)), client.empty(8, "f32")
    gone = client.empty(8, "f32")
    del service.state.buffers[gone.id]  # the daemon no longer knows it: it refuses the launch
    bad = session.launch([gone], [y], wait=False, n=8)
    until(lambda: len(service.state.launches) == 1)
    time.sleep(0.2)  # its answer is back
    with pytest.raises(errors.NotFound) as caught:
        session.launch([x], [y], n=8)
    message = str(caught.value)
    assert f"#{tag_of(bad)}" in message and session.id in message
    assert "not waited" in message or "without waiting" in message
    assert "was not sent" in message and caught.value.fields == ("buffer_id",)
    assert len(service.state.launches) == 1  # the launch that raised it was not sent
    # Reported once: the session works on, and its wait does not raise it again.
    session.launch([x], [y], n=8)
    session.wait()
    with pytest.raises(errors.NotFound) as again:
        bad.wait()  # the launch itself still says why it failed
    assert "was refused" in str(again.value) and "not sent" not in str(again.value)


def test_a_refusal_nobody_waited_for_is_raised_by_session_wait(
    fake: tuple[str, FakeLaunchService], client: Client
) -> None:
    service = fake[1]
    session = client.load(SCAN)
    x, y = client.buffer(np.ones(8, np.float32)), client.empty(8, "f32")
    gone = client.empty(8, "f32")
    del service.state.buffers[gone.id]
    service.answer_delay = 0.1
    session.launch([x], [y], wait=False, n=8)
    bad = session.launch([gone], [y], wait=False, n=8)
    session.launch([x], [y], wait=False, n=8)
    with pytest.raises(errors.NotFound) as caught:
        session.wait()  # no sleep: the wait itself collects the answers
    assert f"launch #{tag_of(bad)} of session {session.id}" in str(caught.value)
    assert caught.value.metadata["launch"] == f"#{tag_of(bad)}"
    session.wait()  # reported once


def test_launch_wait_reports_its_own_refusal_once(
    fake: tuple[str, FakeLaunchService], client: Client
) -> None:
    service = fake[1]
    session = client.load(SCAN)
    y = client.empty(8, "f32")
    gone = client.empty(8, "f32")
    del service.state.buffers[gone.id]
    bad = session.launch([gone], [y], wait=False, n=8)
    with pytest.raises(errors.NotFound) as caught:
        bad.wait()
    assert "was refused" in str(caught.value)
    session.wait()  # already reported by the launch's own wait


def test_the_window_blocks_the_next_launch(
    fake: tuple[str, FakeLaunchService], client: Client
) -> None:
    service = fake[1]
    client.launch_window = 2
    assert client.launch_window == 2
    session = client.load(SCAN)
    x, y = client.buffer(np.ones(8, np.float32)), client.empty(8, "f32")
    service.answer_delay = 0.3
    started = time.monotonic()
    session.launch([x], [y], wait=False, n=8)
    session.launch([x], [y], wait=False, n=8)
    assert time.monotonic() - started < 0.25
    session.launch([x], [y], wait=False, n=8)  # two unanswered: waits for the first answer
    assert time.monotonic() - started >= 0.25
    with pytest.raises(errors.DeadlineExceeded, match=f"session {session.id} was not sent"):
        session.launch([x], [y], wait=False, n=8, timeout=0.05)
    session.wait()
    with pytest.raises(ValueError, match="launch_window"):
        client.launch_window = 0


def test_nothing_sent_is_lost_when_the_client_closes(fake: tuple[str, FakeLaunchService]) -> None:
    service = fake[1]
    service.launch_delay = 0.02
    with Client(fake[0], client_name="closer") as client:
        session = client.load(SCAN)
        x, y = client.buffer(np.ones(8, np.float32)), client.empty(8, "f32")
        for _ in range(20):
            session.launch([x], [y], wait=False, n=8)
    assert len(service.state.launches) == 20


@pytest.mark.parametrize("way", ["ring-stream", "launch-stream"])
def test_pipelined_launches_over_tcp_on_a_real_daemon(
    way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if way == "launch-stream":
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
        bad = session.launch([x, y], [y], wait=False, n=n + 1, a=1.0)
        with pytest.raises(errors.AccyError) as caught:
            session.wait()
        named = f"ring record {bad._seq}" if way == "ring-stream" else f"launch #{tag_of(bad)}"
        assert named in str(caught.value)
        assert caught.value.fields == ("n",) or "n" in str(caught.value)
