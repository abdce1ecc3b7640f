"""What a new user gets wrong first is refused clearly, in accy's own errors, on every path."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from accy import _handoff, errors
from accy.client import Client
from tests.client.fake_daemon import FakeLaunchService

SCAN = "accy.kernel.device_scan"


@pytest.fixture(params=[False, True], ids=["unary", "ring-stream"])
def ways(request: pytest.FixtureRequest, fake: tuple[str, FakeLaunchService]) -> Iterator[Client]:
    fake[1].rings = request.param
    with Client(fake[0], client_name="new") as client:
        yield client


def test_a_numpy_array_where_a_buffer_belongs_says_to_upload_it(ways: Client) -> None:
    client = ways
    session = client.load(SCAN)
    y = client.empty(8, "f32")
    for _ in range(2):  # a link's first launch, and a later one
        with pytest.raises(errors.InvalidArgument) as caught:
            session.launch([np.ones(8, np.float32)], [y], n=8)
        assert caught.value.reason == "NOT_A_BUFFER"
        assert caught.value.fields == ("operands[0]",)
        assert "client.buffer(array)" in caught.value.message
        session.launch([client.buffer(np.ones(8, np.float32))], [y], n=8)
    with pytest.raises(errors.InvalidArgument, match=r"results\[0\] is a list"):
        session.launch([y], [[1.0, 2.0]], n=8)  # type: ignore[list-item]


def test_a_launch_after_close_says_the_client_was_closed(ways: Client) -> None:
    client = ways
    session = client.load(SCAN)
    x, y = client.buffer(np.ones(8, np.float32)), client.empty(8, "f32")
    launch = session.launch([x], [y], wait=False, n=8)
    client.close()
    for call in (
        lambda: session.launch([x], [y], n=8),
        lambda: session.launch([x], [y], wait=False, n=8),
        session.wait,
        lambda: y.read(),
    ):
        with pytest.raises(errors.ClientClosed) as caught:
            call()
        assert "is closed" in caught.value.message and "launch it again" not in str(caught.value)
        assert caught.value.reason == "CLIENT_CLOSED" and isinstance(caught.value, RuntimeError)
    if not launch.completed:  # sent before the close: its wait says so too, if it must wait
        with pytest.raises(errors.ClientClosed):
            launch.wait()


def test_a_handoff_socket_that_never_answers_is_an_accy_error(tmp_path: Path) -> None:
    path = tmp_path / "slow.rings"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    held: list[socket.socket] = []
    accepting = threading.Thread(target=lambda: held.append(listener.accept()[0]), daemon=True)
    accepting.start()
    started = time.monotonic()
    try:
        with pytest.raises(_handoff.HandoffRefused) as caught:  # not a built-in TimeoutError
            _handoff.take(path, "seg_x", b"\0" * 32, 1, timeout=0.2)
        assert isinstance(caught.value, errors.Unavailable)
        assert "within 0.2 s" in caught.value.message
        assert time.monotonic() - started < 2
    finally:
        for peer in held:
            peer.close()
        listener.close()
