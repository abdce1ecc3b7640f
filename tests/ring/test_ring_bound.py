"""Bound launches: a launch checked once and replayed, until anything it names changes."""

from __future__ import annotations

import struct

import numpy as np

from accy.protocol import ring as layout
from accyd.catalog.dtypes import DType, Scalar
from accyd.core.daemon import Daemon
from accyd.ring import RingDoor
from tests.core.daemon_fixtures import host_daemon
from tests.ring.test_ring_core import open_ring, read, write

SAXPY = "accy.kernel.saxpy"
N = 256


def saxpy_scalars(a: float) -> bytes:
    return struct.pack("<I4xf4x", N, a)


def test_replayed_launches_compute_every_step_in_order(door: tuple[Daemon, RingDoor]) -> None:
    daemon, ring_door = door
    client = daemon.attach("bound").id
    session = daemon.load_pipeline(client, SAXPY).session_id
    acc = daemon.allocate_buffer(client, 4 * N, DType.F32).id
    ones = daemon.allocate_buffer(client, 4 * N, DType.F32).id
    write(daemon, client, ones, np.ones(N, np.float32))
    ring = open_ring(ring_door, client)
    try:
        s, a, o = (ring.new_handle() for _ in range(3))
        ring.bind(layout.Kind.BIND_SESSION, s, session, 1.0)
        ring.bind(layout.Kind.BIND_BUFFER, a, acc, 1.0)
        ring.bind(layout.Kind.BIND_BUFFER, o, ones, 1.0)
        last = 0
        for _ in range(40):  # acc = 1 * acc + 1, forty times, most of them replayed
            last = ring.launch(s, [a, o], [a], saxpy_scalars(1.0), 2, notify=False, timeout=5)
        ring.wait(last, 10)
        assert ring.errors() == []
        assert np.all(read(daemon, client, acc, N) == 40.0)
        status = daemon.status()
        assert status.launches_total == 40
        daemon.wait_launch(client, session)
        assert daemon.status().tenants[0].usage.launches_in_flight == 0
    finally:
        ring.close()


def test_a_freed_buffer_is_never_launched_again(door: tuple[Daemon, RingDoor]) -> None:
    daemon, ring_door = door
    client = daemon.attach("bound").id
    session = daemon.load_pipeline(client, SAXPY).session_id
    x = daemon.allocate_buffer(client, 4 * N, DType.F32).id
    y = daemon.allocate_buffer(client, 4 * N, DType.F32).id
    ring = open_ring(ring_door, client)
    try:
        s, hx, hy = (ring.new_handle() for _ in range(3))
        ring.bind(layout.Kind.BIND_SESSION, s, session, 1.0)
        ring.bind(layout.Kind.BIND_BUFFER, hx, x, 1.0)
        ring.bind(layout.Kind.BIND_BUFFER, hy, y, 1.0)
        for _ in range(3):
            done = ring.launch(s, [hx, hy], [hy], saxpy_scalars(2.0), 2, notify=True, timeout=5)
            ring.wait(done, 10)
        daemon.free_buffer(client, y)
        refused = ring.launch(s, [hx, hy], [hy], saxpy_scalars(2.0), 2, notify=True, timeout=5)
        ring.wait(refused, 10)
        [error] = ring.errors()
        assert error.seq == refused and error.reason == "NOT_FOUND"
        assert daemon.status().launches_total == 3
    finally:
        ring.close()


def test_a_bound_launch_goes_stale_when_what_it_names_changes() -> None:
    daemon, _ = host_daemon()
    try:
        client = daemon.attach("c").id
        session = daemon.load_pipeline(client, "accy.kernel.device_scan").session_id
        x = daemon.allocate_buffer(client, 4 * 5000, DType.F32).id
        y = daemon.allocate_buffer(client, 4 * 5000, DType.F32).id
        n = {"n": Scalar.u32(5000)}
        assert daemon.bind_launch(client, session, [x], [y], n) is None  # no scratch: no replay
        daemon.allocate_intermediates(client, session, n)
        bound = daemon.bind_launch(client, session, [x], [y], n)
        assert bound is not None and daemon.launch_bound(bound, 2)
        daemon.allocate_intermediates(client, session, {"n": Scalar.u32(50000)})  # new scratch
        assert not daemon.launch_bound(bound)
        bound = daemon.bind_launch(client, session, [x], [y], n)
        assert bound is not None
        daemon.free_buffer(client, x)
        assert not daemon.launch_bound(bound)
        daemon.wait_launch(client, session)
        assert daemon.status().launches_total == 2
    finally:
        daemon.close()


def test_a_bound_launch_keeps_its_prepared_launch_until_the_session_closes_it() -> None:
    daemon, backend = host_daemon()
    prepares: list[int] = []
    prepare = backend.prepare

    def counting(requests: object) -> object:
        prepares.append(1)
        return prepare(requests)  # type: ignore[arg-type]

    backend.prepare = counting  # type: ignore[method-assign]
    try:
        client = daemon.attach("c").id
        session = daemon.load_pipeline(client, SAXPY).session_id
        acc = daemon.allocate_buffer(client, 4 * N, DType.F32).id
        ones = daemon.allocate_buffer(client, 4 * N, DType.F32).id
        write(daemon, client, ones, np.ones(N, np.float32))
        scalars = {"n": Scalar.u32(N), "a": Scalar.f32(1.0)}
        bound = daemon.bind_launch(client, session, [acc, ones], [acc], scalars)
        assert bound is not None
        for _ in range(5):
            assert daemon.launch_bound(bound, 2)
        assert len(prepares) == 1  # checked and packed once, replayed ten times
        bound.session.prepared.clear()  # as an eviction from the session's cache closes it
        assert daemon.launch_bound(bound, 2)
        assert len(prepares) == 2  # prepared again, never a closed one replayed
        daemon.wait_launch(client, session)
        assert np.all(read(daemon, client, acc, N) == 12.0)
        status = daemon.status()
        assert status.launches_total == 12
        assert status.tenants[0].usage.launches_in_flight == 0
    finally:
        daemon.close()


def test_freeing_another_buffer_leaves_a_bound_launch_valid_and_checked() -> None:
    daemon, _ = host_daemon()
    try:
        client = daemon.attach("c").id
        session = daemon.load_pipeline(client, SAXPY).session_id
        x = daemon.allocate_buffer(client, 4 * N, DType.F32).id
        y = daemon.allocate_buffer(client, 4 * N, DType.F32).id
        other = daemon.allocate_buffer(client, 64).id
        write(daemon, client, x, np.ones(N, np.float32))
        scalars = {"n": Scalar.u32(N), "a": Scalar.f32(1.0)}
        bound = daemon.bind_launch(client, session, [x, y], [y], scalars)
        assert bound is not None and daemon.launch_bound(bound)
        daemon.free_buffer(client, other)  # the client's frees move: its buffers are checked
        assert daemon.launch_bound(bound)
        daemon.free_buffer(client, x)
        assert not daemon.launch_bound(bound)  # and a freed one of its own is found
        daemon.wait_launch(client, session)
        assert np.all(read(daemon, client, y, N) == 2.0)
    finally:
        daemon.close()
