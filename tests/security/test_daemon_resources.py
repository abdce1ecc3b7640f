"""The daemon's own resources a client makes are charged and bounded, with no quota configured:
clients, descriptors, segment and ring memory; what a client cannot take is not made."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from accy.protocol import ring as layout
from accy.protocol.launch.v1 import launch_pb2 as pb
from accyd.core.daemon import Daemon
from accyd.core.limits import daemon_limits
from accyd.core.tenants import Quotas, Usage
from accyd.doors.hostmem import Segments
from accyd.doors.hostmem import handoff as handoff_module
from accyd.doors.hostmem.segments import SEGMENT_DESCRIPTORS
from accyd.errors import QuotaExceeded
from accyd.ring import RingDoor
from accyd.ring.charges import RING_DESCRIPTORS, RingCharges
from accyd.ring.engine.auto import open_engine
from accyd.scheduling import DeviceWork
from tests.core.daemon_fixtures import host_daemon
from tests.launch_service.harness import ServerThread, attach, details, make_config, rpc_error


def usage_of(daemon: Daemon, tenant: str = "local") -> Usage:
    (found,) = [t for t in daemon.status().tenants if t.name == tenant]
    return found.usage


def test_with_no_quota_a_tenant_gets_half_of_each_ceiling_and_all_of_them_the_ceiling() -> None:
    daemon, _ = host_daemon()
    daemon.set_limits(daemon_limits(shared_memory_bytes=8 << 20, descriptors=400))
    # 400 descriptors: 200 kept back, 200 for clients, 100 for each tenant by default.
    a = [daemon.attach("a", tenant="a") for _ in range(2)]
    b = daemon.attach("b", tenant="b")
    c = daemon.attach("c", tenant="c")
    for index in range(100):
        daemon.charge(a[index % 2].id, Usage(descriptors=1))
    with pytest.raises(QuotaExceeded, match="descriptors quota is 100"):
        daemon.charge(a[1].id, Usage(descriptors=1))  # the tenant's share, over its clients
    daemon.charge(b.id, Usage(descriptors=100))
    with pytest.raises(QuotaExceeded, match="the daemon holds 200 descriptors"):
        daemon.charge(c.id, Usage(descriptors=1))  # the ceiling: the reserve stays free
    with pytest.raises(QuotaExceeded, match="host_memory_bytes quota is 4194304"):
        daemon.charge(c.id, Usage(host_memory_bytes=(4 << 20) + 1))
    daemon.refund(b, Usage(descriptors=100))
    daemon.charge(c.id, Usage(descriptors=1))
    daemon.close()


def test_clients_per_tenant_are_bounded_and_given_back_at_detach() -> None:
    daemon, _ = host_daemon(quotas=Quotas(clients=2))
    first, _second = daemon.attach("1"), daemon.attach("2")
    with pytest.raises(QuotaExceeded, match="clients quota is 2"):
        daemon.attach("3")
    daemon.detach(first.id)
    daemon.attach("3")
    assert usage_of(daemon).clients == 2
    daemon.close()
    assert usage_of(daemon).clients == 0


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[tuple[Daemon, Segments, RingDoor]]:
    daemon, _ = host_daemon()
    engine = open_engine(daemon, kind="python")
    work = DeviceWork(2)
    door = RingDoor(daemon, tmp_path / "accyd.sock", engine, work=work)
    door.charges = RingCharges(daemon)
    daemon.extend(door)
    segments = door.copier.copies = Segments(daemon, door.handoff)
    daemon.extend(segments)
    engine.start()
    door.start()
    try:
        yield daemon, segments, door
    finally:
        segments.close_all()
        door.close()
        engine.close()
        daemon.close()
        work.close()


def test_segments_and_rings_charge_their_memory_and_descriptors(
    shared: tuple[Daemon, Segments, RingDoor],
) -> None:
    daemon, segments, door = shared
    client = daemon.attach("c").id
    segments.open(client, 1 << 20)
    door.offer(client, 1024)
    held = usage_of(daemon)
    assert held.descriptors == SEGMENT_DESCRIPTORS + RING_DESCRIPTORS
    assert held.host_memory_bytes == (1 << 20) + layout.ring_bytes(1024)
    segments.close_client(client)
    door.close_client(client)
    daemon.detach(client)
    deadline = time.monotonic() + 5  # the untaken segment is freed on a thread of its own
    while usage_of(daemon) != Usage() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert usage_of(daemon) == Usage()


def test_a_segment_whose_offer_is_never_taken_is_freed(
    shared: tuple[Daemon, Segments, RingDoor], monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon, segments, _ = shared
    monkeypatch.setattr(handoff_module, "OFFER_SECONDS", 0.3)
    client = daemon.attach("c").id
    for _ in range(5):
        segments.open(client, 4096)
    assert segments.count(client) == 5
    deadline = time.monotonic() + 5
    while segments.count(client) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert segments.count(client) == 0, "untaken segments stay open"
    while usage_of(daemon).descriptors and time.monotonic() < deadline:
        time.sleep(0.05)
    assert usage_of(daemon).descriptors == 0
    assert usage_of(daemon).host_memory_bytes == 0


def test_a_tenant_at_its_descriptor_share_is_refused_and_the_daemon_serves_on(
    shared: tuple[Daemon, Segments, RingDoor],
) -> None:
    """Thousands of tiny segments once put the daemon at its descriptor limit: new clients
    could not attach and status failed."""
    daemon, segments, _ = shared
    daemon.set_limits(daemon_limits(descriptors=400))  # 200 for clients, 100 a tenant
    clients = [daemon.attach(f"a{i}", tenant="a").id for i in range(4)]
    opened = 0
    with pytest.raises(QuotaExceeded, match="descriptors"):
        for index in range(1000):
            segments.open(clients[index % 4], 64)
            opened += 1
    assert opened == 100 // SEGMENT_DESCRIPTORS
    other = daemon.attach("b", tenant="b").id
    segments.open(other, 64)  # another tenant's share is untouched
    assert daemon.status().clients == 5


def test_memory_is_shared_only_with_clients_on_the_unix_socket(tmp_path: Path) -> None:
    config = make_config(tmp_path, "unix", listen=(f"unix:{tmp_path / 's.sock'}", "127.0.0.1:0"))
    running = ServerThread(config)
    try:
        tcp = running.server.addresses[1]
        with grpc.insecure_channel(tcp) as channel:
            client = attach(channel)
            for call in (
                lambda: client.OpenSegment(pb.OpenSegmentRequest(byte_size=4096)),
                lambda: client.OpenRing(pb.OpenRingRequest(slots=64)),
            ):
                error = rpc_error(call)
                assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert "came over TCP" in (error.details() or "")
                assert details(error)["BadRequest"].field_violations
            status = running.server.daemon.status()
            (tenant,) = status.tenants
            assert (tenant.usage.descriptors, tenant.usage.host_memory_bytes) == (0, 0)
            client.detach()
    finally:
        running.stop()


def test_a_ring_stream_is_charged_while_it_is_open(tmp_path: Path) -> None:
    running = ServerThread(make_config(tmp_path, "tcp"))
    outbox: queue.SimpleQueue[pb.RingFrame | None] = queue.SimpleQueue()
    try:
        with grpc.insecure_channel(running.address) as channel:
            client = attach(channel)
            outbox.put(pb.RingFrame(slots=64))
            stream = client.stub.RingStream(iter(outbox.get, None), metadata=client.metadata)
            assert next(stream).slots == 64
            daemon = running.server.daemon
            assert usage_of(daemon).host_memory_bytes >= layout.ring_bytes(64)
            outbox.put(None)
            list(stream)
            deadline = time.monotonic() + 5
            while usage_of(daemon).host_memory_bytes and time.monotonic() < deadline:
                time.sleep(0.02)
            assert usage_of(daemon).host_memory_bytes == 0
            client.detach()
    finally:
        running.stop()


def test_segment_charges_are_refused_past_the_shared_memory_share(
    shared: tuple[Daemon, Segments, RingDoor],
) -> None:
    """A segment may be up to 1 TiB: without a quota, each tenant's half of the daemon's
    shared memory bounds them (three clients once mapped 128 TiB)."""
    daemon, segments, _ = shared
    daemon.set_limits(daemon_limits(shared_memory_bytes=64 << 20))
    client = daemon.attach("big").id
    segments.open(client, 16 << 20)
    with pytest.raises(QuotaExceeded, match="host_memory_bytes"):
        segments.open(client, 1 << 40)
    with pytest.raises(QuotaExceeded, match="host_memory_bytes"):
        segments.open(client, 17 << 20)
