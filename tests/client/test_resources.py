"""Sessions, buffers and launches as objects: made by their owner, closed once, freed if dropped."""

from __future__ import annotations

import gc
import statistics

import numpy as np
import pytest

from accy import Buffer, Client, Launch, Session, errors
from accy._reattach import FIRST_RETRY, MAX_RETRY, backoff
from tests.client.fake_daemon import FakeLaunchService, until

SCAN = "accy.kernel.device_scan"


def test_resources_are_made_by_their_owner_only(client: Client) -> None:
    for kind, owner in ((Buffer, "Client.buffer"), (Session, "Client.load"), (Launch, "launch")):
        with pytest.raises(TypeError, match=owner):
            kind(client, "buf_forged", 4)


def test_a_released_session_refuses_locally(
    client: Client, fake: tuple[str, FakeLaunchService]
) -> None:
    state = fake[1].state
    session = client.load(SCAN)
    x = client.buffer(np.ones(4, np.float32))
    session.launch([x], [x], n=4)
    session.release()
    sent = len(state.launches)
    for attempt in (
        lambda: session.launch([x], [x], n=4),
        lambda: session.allocate_intermediates(n=4),
        lambda: session.wait(),
    ):
        with pytest.raises(errors.FailedPrecondition, match="was released") as caught:
            attempt()
        assert caught.value.reason == "SESSION_RELEASED"
    assert len(state.launches) == sent  # nothing went to the daemon
    assert "released" in repr(session)


def test_close_is_idempotent(client: Client, fake: tuple[str, FakeLaunchService]) -> None:
    state = fake[1].state
    buffer = client.empty(4, "f32")
    session = client.load(SCAN)
    for _ in range(3):
        buffer.free()
        session.release()
    assert buffer.closed and session.closed
    assert buffer.id not in state.buffers and session.id not in state.sessions
    with pytest.raises(errors.InvalidArgument, match="was freed"):
        buffer.read()


def test_a_dropped_buffer_and_session_are_freed(
    client: Client, fake: tuple[str, FakeLaunchService]
) -> None:
    state = fake[1].state
    buffer_id = client.empty(1024, "u8").id  # the buffer itself is dropped at once
    session_id = client.load(SCAN).id
    gc.collect()
    until(lambda: buffer_id not in state.buffers and session_id not in state.sessions)
    kept = client.empty(16, "u8")
    gc.collect()
    assert kept.id in state.buffers  # a buffer still held is left alone


def test_reattach_back_off_is_full_jitter() -> None:
    for attempt in range(8):
        cap = min(MAX_RETRY, FIRST_RETRY * 2**attempt)
        delays = [backoff(attempt) for _ in range(400)]
        assert all(0.0 <= d <= cap for d in delays)
        # Spread over the whole range (not a fixed step): clients do not retry in lockstep.
        assert min(delays) < cap * 0.1 and max(delays) > cap * 0.9
        assert statistics.pstdev(delays) > cap * 0.2
