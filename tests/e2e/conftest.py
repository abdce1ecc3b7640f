"""Fixtures of the end-to-end tests: one real daemon (host backend) for the whole module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from accy.testing import RunningDaemon, running_daemon


@pytest.fixture(scope="session")
def daemon() -> Iterator[RunningDaemon]:
    """``accyd serve --backend host`` on a temporary Unix socket and TCP loopback."""
    with running_daemon(backend="host") as running:
        yield running
        assert running.process.poll() is None, f"accyd died during the tests:\n{running.log_text()}"


@pytest.fixture(params=["unix", "tcp"])
def target(request: pytest.FixtureRequest, daemon: RunningDaemon) -> str:
    """Each transport the daemon serves."""
    if request.param == "unix":
        return daemon.unix_target
    assert daemon.tcp_target is not None
    return daemon.tcp_target
