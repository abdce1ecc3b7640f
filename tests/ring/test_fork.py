"""A Client used after ``fork()``: the child refuses with a clear error, and the parent's ring
is never written by another process (its launches run as before, none lost)."""

from __future__ import annotations

import gc
import os
import select
import signal
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from accy import Client
from accy._ring_path import RingLaunches
from accy.errors import ClientClosed
from accy.protocol import ring as layout
from accy.testing import transport_of
from tests.launch_service.harness import ServerThread, make_config

SAXPY = "accy.kernel.saxpy"
N = 64
CHILD_SECONDS = 30.0


@pytest.fixture
def served(tmp_path: Path) -> Iterator[ServerThread]:
    server = ServerThread(make_config(tmp_path, "unix"))
    try:
        yield server
    finally:
        server.stop()


def in_child(work: object) -> str:
    """Run ``work()`` in a forked child; what it returned (or raised), as text."""
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # forking a threaded process
        pid = os.fork()
    if pid == 0:
        try:
            try:
                said = str(work())  # type: ignore[operator]
            except BaseException as error:
                said = f"{type(error).__name__}: {error}"
            os.write(write, said.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        ready, _, _ = select.select([pipe], [], [], CHILD_SECONDS)
        said = pipe.read().decode() if ready else ""
    if not ready:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert ready, f"the forked child did not finish within {CHILD_SECONDS} s"
    return said


def test_a_forked_child_refuses_and_leaves_the_parents_ring_alone(served: ServerThread) -> None:
    with Client(served.address, client_name="parent") as client:
        x = client.buffer(np.ones(N, np.float32))
        y = client.buffer(np.zeros(N, np.float32))
        spare = client.buffer(np.ones(N, np.float32))
        session = client.load(SAXPY)
        session.launch([x, y], [y], n=N, a=1.0)  # y = 1
        session.launch([spare, spare], [spare], n=N, a=1.0)  # bound: its loss would unbind
        launches = getattr(transport_of(client), "launches", None)
        assert isinstance(launches, RingLaunches)
        ring = launches.ring
        published = int(memoryview(ring._map).cast("Q")[layout.HEAD_WORD])
        assert published == ring.head

        def child() -> str:
            nonlocal spare
            outcomes = []
            for attempt in (
                lambda: session.launch([x, y], [y], n=N, a=1.0),
                lambda: session.launch([x, y], [y], wait=False, n=N, a=1.0),
                lambda: y.read(),
                lambda: client.status(),
            ):
                try:
                    attempt()
                    outcomes.append("went through")
                except ClientClosed as refused:
                    outcomes.append(f"{refused.reason}: {refused.message}")
            del spare  # its safety net must not unbind it on the parent's ring
            gc.collect()
            session.release()
            client.close()
            return "\n".join(outcomes)

        said = in_child(child)
        lines = said.splitlines()
        assert len(lines) == 4 and all(line.startswith("CLIENT_FORKED: ") for line in lines), said
        assert f"made in process {os.getpid()}" in lines[0] and "after fork()" in lines[0]
        assert int(memoryview(ring._map).cast("Q")[layout.HEAD_WORD]) == published == ring.head
        session.launch([x, y], [y], n=N, a=10.0)  # y = 10 * 1 + 1: the parent's work is its own
        np.testing.assert_array_equal(y.read(), np.full(N, 11.0, np.float32))
        np.testing.assert_array_equal(spare.read(), np.full(N, 2.0, np.float32))
        assert client.status().my_buffers == 3
