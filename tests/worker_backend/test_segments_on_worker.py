"""Host-shared segments on a daemon whose device is a worker: ``tests/hostmem``'s flows, zero-copy.

The core segment tests (quota, copies ordered with launches, a detached
client's teardown, limits) run again with ``world`` built over a
``WorkerBackend``; then a segment's copies are shown to move no bytes over the
worker's channel, and a daemon serving with ``ACCYD_DEVICE_WORKERS=1`` runs the
end-to-end shared-memory flow, its worker mapping the client's segments.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import tests.hostmem.test_segments_core as core
import tests.hostmem.test_shared_buffers as end_to_end
from accy import Client
from accy.testing import RunningDaemon, running_daemon
from accyd.backends.worker.front.proxy import WorkerBackend
from accyd.backends.worker.protocol import Op
from accyd.catalog import load_catalog
from accyd.catalog.dtypes import DType
from accyd.core.daemon import Daemon
from accyd.core.tenants import Quotas
from accyd.doors.hostmem import Segments
from accyd.doors.hostmem.handoff import Handoff
from tests.worker_backend.conftest import traffic

# The core's segment tests, collected here with this module's ``world``.
test_segments_count_against_the_memory_quota = core.test_segments_count_against_the_memory_quota
test_copies_are_ordered_with_launches_and_checked = (
    core.test_copies_are_ordered_with_launches_and_checked
)
test_a_detached_client_leaves_no_segment = core.test_a_detached_client_leaves_no_segment
test_segment_limits = core.test_segment_limits
# One end-to-end flow, collected here with this module's ``daemon``.
test_write_launch_read_through_shared_memory = (
    end_to_end.test_write_launch_read_through_shared_memory
)

World = tuple[Daemon, Segments, Handoff]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    backend = WorkerBackend("host", 0, log_level="warning")
    daemon = Daemon(load_catalog(), {0: backend}, quotas=Quotas(memory_bytes=core.QUOTA))
    handoff = Handoff(tmp_path / "accyd.sock")
    handoff.start()
    segments = Segments(daemon, handoff)
    try:
        yield daemon, segments, handoff
    finally:
        segments.close_all()
        handoff.close()
        daemon.close()
        backend.close()
        assert backend.reaped


def segment_maps(pid: int) -> int:
    return Path(f"/proc/{pid}/maps").read_text().count("accy-segment")


def test_a_segments_copies_move_no_bytes_over_the_channel(world: World) -> None:
    daemon, segments, handoff = world
    backend = daemon.backends[0]
    assert isinstance(backend, WorkerBackend)
    client = daemon.attach("z").id
    n = 1 << 18
    offer = segments.open(client, 2 * 4 * n)
    assert segment_maps(backend.pid) == 1  # the worker mapped the segment itself
    shared = core.take(handoff, offer.segment_id, offer.ticket, offer.byte_size)
    view = np.frombuffer(shared, dtype=np.float32)
    view[:n] = np.arange(n, dtype=np.float32)
    buffer = daemon.allocate_buffer(client, 4 * n, DType.F32).id
    with traffic(backend) as moved:
        segments.prepare(client, offer.segment_id, 0, buffer, 0, 4 * n, to_buffer=True).run()
        segments.prepare(client, offer.segment_id, 4 * n, buffer, 0, 4 * n, to_buffer=False).run()
    assert Op.WRITE_SHARED in moved.calls and Op.READ_SHARED in moved.calls
    assert Op.WRITE not in moved.calls and Op.READ not in moved.calls
    assert moved.sent < 4096 and moved.received == 0
    np.testing.assert_array_equal(view[n:], np.arange(n, dtype=np.float32))
    del view
    shared.close()
    segments.close(client, offer.segment_id)
    assert segment_maps(backend.pid) == 0  # unpinned and unmapped in the worker


@pytest.fixture(scope="module")
def daemon() -> Iterator[RunningDaemon]:
    """``accyd serve`` on the host backend with its device in a worker process."""
    with running_daemon(backend="host", tcp=False, env={"ACCYD_DEVICE_WORKERS": "1"}) as running:
        yield running
        assert running.process.poll() is None, f"accyd died:\n{running.log_text()}"


def worker_pids(daemon: RunningDaemon) -> list[int]:
    """The device workers of the serving process (the active one and its spare)."""
    server = end_to_end.server_pid(daemon)
    children = Path(f"/proc/{server}/task/{server}/children").read_text().split()
    return [
        int(pid)
        for pid in children
        if b"accyd.backends.worker.child.main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]


def test_a_served_worker_maps_the_clients_segments_while_they_live(daemon: RunningDaemon) -> None:
    workers = worker_pids(daemon)
    assert workers, "the daemon runs no device worker"
    before = sum(segment_maps(pid) for pid in workers)
    data = np.arange(1 << 20, dtype=np.float32)
    with Client(daemon.unix_target) as client:
        shared = client.shared_array(data.size, np.float32)
        shared[:] = data
        buffer = client.empty(data.size, np.float32)
        buffer.write(shared)
        shared[:] = 0
        buffer.read(out=shared)
        np.testing.assert_array_equal(shared, data)
        assert sum(segment_maps(pid) for pid in workers) > before
        del shared
    deadline = time.monotonic() + 10  # the client's detach closes its segments
    while sum(segment_maps(pid) for pid in workers) != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sum(segment_maps(pid) for pid in workers) == before, "a worker still maps a segment"


def test_segments_are_pinned_again_for_the_worker_that_replaced_their_device(
    world: World,
) -> None:
    daemon, segments, handoff = world
    old = daemon.backends[0]
    assert isinstance(old, WorkerBackend)
    client = daemon.attach("r").id
    offer = segments.open(client, 4096)
    new = WorkerBackend("host", 0, log_level="warning")
    try:
        assert segments.repin(0, new) == 1
        assert (segment_maps(old.pid), segment_maps(new.pid)) == (0, 1)
        shared = core.take(handoff, offer.segment_id, offer.ticket, offer.byte_size)
        shared[:4096] = bytes(range(256)) * 16
        buffer = new.allocate_buffer(4096)
        segment = segments._segment(client, offer.segment_id)
        with traffic(new) as moved:
            new.write(buffer, 0, segment.range(0, 4096), None)
        assert Op.WRITE_SHARED in moved.calls and moved.sent < 4096
        assert new.read(buffer, 0, 4096, None) == bytes(range(256)) * 16
        new.destroy(buffer)
        shared.close()
        segments.close(client, offer.segment_id)
        assert segment_maps(new.pid) == 0
    finally:
        new.close()


def test_a_buffer_exported_from_a_worker_is_the_workers_memory(daemon: RunningDaemon) -> None:
    workers = worker_pids(daemon)
    data = np.arange(1 << 16, dtype=np.float32)
    with Client(daemon.unix_target) as client, client.load("accy.kernel.saxpy") as session:
        x = client.buffer(data)
        out = client.empty(data.size, np.float32, exportable=True)
        session.launch(operands=[x, x], results=[out], n=data.size, a=2.0, wait=False)
        with out.export() as view:
            np.testing.assert_array_equal(view.numpy(), 3 * data)
            maps = sum(
                Path(f"/proc/{pid}/maps").read_text().count("accy-buffer") for pid in workers
            )
            assert maps == 1  # the worker's own mapping: what we see is its memory
            view.numpy()[:] = 1
            assert out.read()[-1] == 1
