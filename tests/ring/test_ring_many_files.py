"""A client in a process with more than 1024 files open: its ring waits still sleep and wake.

``select.select`` refuses a descriptor numbered 1024 or more (``ValueError``), which the
ring's wait once took for its mapping being closed: a waited launch failed with
"the daemon closed this client's ring" in any process that had many files open (a server,
a long test run), and a ring stream's sender stopped sending.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest

from accy import Client
from accy.testing import RunningDaemon, running_daemon, transport_of

SAXPY = "accy.kernel.saxpy"
N = 1 << 20  # long enough on the host backend that a waited launch sleeps, not spins


@pytest.fixture(scope="module")
def daemon() -> Iterator[RunningDaemon]:
    with running_daemon(backend="host", tcp=False) as running:
        yield running


@pytest.fixture
def high_descriptors() -> Iterator[None]:
    """Every descriptor number below 1100 taken, so what the client opens is numbered above."""
    held: list[int] = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        yield
    finally:
        for fd in held:
            os.close(fd)


@pytest.mark.parametrize("ring", ["1", "stream"])
def test_waited_launches_on_descriptors_above_1024(
    daemon: RunningDaemon, ring: str, high_descriptors: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCY_RING", ring)
    x = np.random.default_rng(7).standard_normal(N).astype(np.float32)
    with Client(daemon.unix_target) as client, client.load(SAXPY) as session:
        bx, by = client.buffer(x), client.buffer(np.zeros(N, np.float32))
        for a in (1.0, 2.0, 3.0):
            session.launch(operands=[bx, by], results=[by], n=N, a=a)  # waited: it sleeps
        path = transport_of(client).path
        assert path == {"1": "ring", "stream": "ring-stream"}[ring], path
        np.testing.assert_allclose(by.read(), np.float32(6.0) * x, rtol=1e-5)
