"""Fixtures of the end-to-end tests: one real daemon (host backend) for the whole module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from accy.protocol.ring import RING_ENV
from accy.testing import RunningDaemon, running_daemon


@pytest.fixture(scope="session")
def daemon() -> Iterator[RunningDaemon]:
    """``accyd serve --backend host`` on a temporary Unix socket and TCP loopback."""
    with running_daemon(backend="host") as running:
        yield running
        assert running.process.poll() is None, f"accyd died during the tests:\n{running.log_text()}"


@pytest.fixture(params=["ring", "unix", "tcp"])
def target(
    request: pytest.FixtureRequest, daemon: RunningDaemon, monkeypatch: pytest.MonkeyPatch
) -> str:
    """Each way in: launches on the same-host ring, as unary ``Launch`` calls on the Unix
    socket, and on the ring over a stream (``RingStream``) on TCP."""
    if request.param == "ring":
        return daemon.unix_target
    if request.param == "unix":
        monkeypatch.setenv(RING_ENV, "0")
        return daemon.unix_target
    assert daemon.tcp_target is not None
    return daemon.tcp_target
