"""Scalars are packed for what they are, never for values that compare equal but differ on
the wire (0.0 and -0.0), whichever way the launch goes."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest

from accy import Client
from accy._scalars import check_scalars
from accy.testing import RunningDaemon, running_daemon, transport_of


@pytest.fixture(scope="module")
def daemon() -> Iterator[RunningDaemon]:
    with running_daemon(backend="host", tcp=False) as running:
        yield running


@pytest.mark.parametrize("ring", ["0", "1"])
def test_negative_zero_is_not_sent_as_zero(
    daemon: RunningDaemon, monkeypatch: pytest.MonkeyPatch, ring: str
) -> None:
    monkeypatch.setenv("ACCY_RING", ring)  # gRPC calls with packed scalars, or ring records
    with Client(daemon.unix_target) as client:
        session = client.load("accy.kernel.saxpy")
        zero = check_scalars(session.info, {"n": 4, "a": 0.0})["a"].f32
        negative = check_scalars(session.info, {"n": 4, "a": -0.0})["a"].f32
        assert math.copysign(1.0, zero) == 1.0 and math.copysign(1.0, negative) == -1.0
        again = check_scalars(session.info, {"n": 4, "a": np.float32(-0.0)})["a"].f32
        assert math.copysign(1.0, again) == -1.0
        x = client.buffer(np.full(4, 2.0, np.float32))
        y = client.buffer(np.full(4, -0.0, np.float32))
        session.launch([x, y], [y], n=4, a=-0.0)  # -0.0 * 2 + -0.0 stays -0.0
        assert np.all(np.signbit(y.read()))
        assert transport_of(client).path == ("unary" if ring == "0" else "ring")


@pytest.mark.parametrize("ring", ["0", "1"])
def test_negative_zero_after_zero_is_its_own_launch(
    monkeypatch: pytest.MonkeyPatch, ring: str
) -> None:
    monkeypatch.setenv("ACCY_RING", ring)
    with (  # a daemon of its own: what it made for other tests' scalars must not count
        running_daemon(backend="host", tcp=False) as daemon,
        Client(daemon.unix_target) as client,
    ):
        session = client.load("accy.kernel.saxpy")
        x = client.buffer(np.full(4, 2.0, np.float32))
        y = client.buffer(np.full(4, -0.0, np.float32))
        session.launch([x, y], [y], n=4, a=0.0)  # prepared for a=0.0: 0.0 * 2 + -0.0 is 0.0
        y.write(np.full(4, -0.0, np.float32))
        session.launch([x, y], [y], n=4, a=-0.0)  # the same buffers, bar the sign of a
        assert np.all(np.signbit(y.read())), "a=-0.0 ran as the launch prepared for a=0.0"
