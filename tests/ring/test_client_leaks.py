"""A closed Client leaves nothing of itself in the process: a program that makes a client per
request (or per round, as the cross-tenant test's victim does) runs for ever on the same
descriptors and memory, on the shared ring and on the ring over a stream alike."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator

import numpy as np
import pytest

from accy import Client
from accy._connection import Connection
from accy._ring_path import RingLaunches
from accy.testing import RunningDaemon, running_daemon, transport_of


@pytest.fixture(scope="module")
def daemon() -> Iterator[RunningDaemon]:
    with running_daemon(backend="host") as running:
        yield running


def one_client(target: str) -> str:
    """A client's life: attach, load, write, launch through its ring, read, close; which way
    its launches went."""
    with Client(target) as client:
        n = 256
        x = client.buffer(np.arange(n, dtype=np.float32))
        y = client.empty(n, np.float32)
        with client.load("accy.kernel.saxpy") as session:
            session.launch(operands=[x, y], results=[y], n=n, a=2.0)
            path = transport_of(client).path
        np.testing.assert_allclose(y.read(), 2.0 * np.arange(n, dtype=np.float32))
    return path


def held() -> tuple[int, int, int]:
    gc.collect()
    connections = sum(isinstance(o, Connection) for o in gc.get_objects())
    rings = sum(isinstance(o, RingLaunches) for o in gc.get_objects())
    return len(os.listdir("/proc/self/fd")), connections, rings


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_closed_clients_leave_no_descriptor_or_object(
    daemon: RunningDaemon, transport: str
) -> None:
    target = daemon.unix_target if transport == "unix" else daemon.tcp_target
    assert target is not None
    path = one_client(target)  # what stays for the process's life (grpc's threads, imports)
    assert path == {"unix": "ring", "tcp": "ring-stream"}[transport]
    fds, connections, rings = held()
    for _ in range(20):
        one_client(target)
    after = held()
    assert after[0] <= fds + 2, f"descriptors {fds} before 20 clients, {after[0]} after"
    # At most as many as before: other tests' clients may still die meanwhile, ours not.
    assert after[1] <= connections and after[2] <= rings, (
        f"connections and ring transports alive: {(connections, rings)} before, {after[1:]} after"
    )
