"""Host-shared buffers end to end: checked results, ownership, hostile ranges, dead clients."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from accy import Client, _handoff, _link_transport, _shm
from accy._seam import CopyRequest
from accy.errors import InvalidArgument, NotFound, ResourceExhausted
from accy.protocol.launch.v1 import launch_pb2 as pb
from accy.testing import RunningDaemon, call, running_daemon, transport_of
from accyd.doors.hostmem.segments import MAX_SEGMENTS_PER_CLIENT

SAXPY = "accy.kernel.saxpy"
N = 1 << 20  # 4 MiB of f32: above the shared-memory threshold


@pytest.fixture(scope="module")
def daemon() -> Iterator[RunningDaemon]:
    with running_daemon(backend="host", tcp=False) as running:
        yield running
        assert running.process.poll() is None, f"accyd died:\n{running.log_text()}"


def segments_of(client: Client) -> int:
    pool = _link_transport.shared_pool(transport_of(client))
    return 0 if pool is None else len(pool._segments)


def server_pid(daemon: RunningDaemon) -> int:
    """The serving process: the supervisor's child."""
    pid = daemon.process.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return int(children[0]) if children else pid


def daemon_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def daemon_segment_maps(pid: int) -> int:
    return Path(f"/proc/{pid}/maps").read_text().count("accy-segment")


def copy(client: Client, **fields: object) -> pb.CopySegmentResponse:
    return call(client, "CopySegment", pb.CopySegmentRequest(**fields))


def test_write_launch_read_through_shared_memory(daemon: RunningDaemon) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal(N).astype(np.float32)
    y = rng.standard_normal(N).astype(np.float32)
    with Client(daemon.unix_target) as client, client.load(SAXPY) as session:
        bx, by, out = client.buffer(x), client.buffer(y), client.empty(N, np.float32)
        assert segments_of(client) >= 1  # the writes went through shared memory
        session.launch(operands=[bx, by], results=[out], n=N, a=2.5)
        got = out.read()
        np.testing.assert_allclose(got, np.float32(2.5) * x + y, rtol=1e-6)
        into = np.empty(N, np.float32)
        assert out.read(out=into) is into
        np.testing.assert_array_equal(into, got)
        # An array that lives in shared memory: written and read with no copy on this side.
        shared = client.shared_array(N, np.float32)
        shared[:] = y
        bx.write(shared)
        session.launch(operands=[bx, by], results=[out], n=N, a=-1.0)
        out.read(out=shared)
        np.testing.assert_allclose(shared, np.float32(-1.0) * y + y, atol=1e-6)
        half = out.read(count=N // 2, offset=N * 2)  # from byte 2N: the second half
        np.testing.assert_array_equal(half, shared[N // 2 :])


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_turned_off_transfers_stay_on_grpc(
    daemon: RunningDaemon, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = np.arange(N, dtype=np.float32)
    if how == "environment":
        monkeypatch.setenv(_shm.SHM_ENV, "0")
    with Client(daemon.unix_target, shared_memory=how != "argument") as client:
        buffer = client.buffer(data)
        np.testing.assert_array_equal(buffer.read(), data)
        assert segments_of(client) == 0


def test_another_client_cannot_use_or_take_a_segment(daemon: RunningDaemon) -> None:
    with Client(daemon.unix_target) as alice, Client(daemon.unix_target) as mallory:
        mine = alice.buffer(np.ones(N, np.float32))
        theirs = mallory.empty(N, np.float32)
        pool = _link_transport.shared_pool(transport_of(alice))
        assert pool is not None
        segment = pool._segments[0]
        for fields in (
            {"buffer_id": theirs.id},
            {"buffer_id": mine.id},
        ):
            with pytest.raises(NotFound):
                copy(
                    mallory,
                    segment_id=segment.id,
                    size=16,
                    direction=pb.COPY_DIRECTION_TO_SEGMENT,
                    **fields,
                )
        with pytest.raises(NotFound):  # alice's segment with mallory's buffer
            copy(alice, segment_id=segment.id, buffer_id=theirs.id, size=16, direction=1)
        # A ticket is good once: a second taker (or a guessed ticket) gets nothing.
        offer = call(mallory, "OpenSegment", pb.OpenSegmentRequest(byte_size=4096))
        handoff = Path(daemon.unix_target.removeprefix("unix:")).with_name(offer.handoff_name)
        with pytest.raises(_handoff.HandoffRefused):
            _handoff.take(handoff, offer.segment_id, bytes(len(offer.ticket)), 1)
        with pytest.raises(_handoff.HandoffRefused):  # the wrong try used no ticket...
            _handoff.take(handoff, segment.id, offer.ticket, 1)  # ...nor fits another id
        fds = _handoff.take(handoff, offer.segment_id, offer.ticket, 1)
        os.close(fds[0])
        with pytest.raises(_handoff.HandoffRefused):
            _handoff.take(handoff, offer.segment_id, offer.ticket, 1)


BIG = (1 << 64) - 1


@pytest.mark.parametrize(
    ("segment_offset", "buffer_offset", "size", "field"),
    [
        (0, 0, BIG, "segment_offset"),
        (BIG, 0, 16, "segment_offset"),
        (4 << 20, 0, 1, "segment_offset"),
        (0, 4 * N - 8, 16, "buffer_offset"),
        (0, BIG, 16, "buffer_offset"),
        (1 << 20, 4 * N, 1, "buffer_offset"),
    ],
)
def test_hostile_ranges_never_leave_the_segment_or_buffer(
    daemon: RunningDaemon, segment_offset: int, buffer_offset: int, size: int, field: str
) -> None:
    data = np.arange(N, dtype=np.float32)
    with Client(daemon.unix_target) as client:
        buffer = client.buffer(data)
        pool = _link_transport.shared_pool(transport_of(client))
        assert pool is not None
        segment = pool._segments[0]
        for direction in (pb.COPY_DIRECTION_TO_BUFFER, pb.COPY_DIRECTION_TO_SEGMENT):
            with pytest.raises(InvalidArgument) as raised:
                copy(
                    client,
                    segment_id=segment.id,
                    segment_offset=segment_offset,
                    buffer_id=buffer.id,
                    buffer_offset=buffer_offset,
                    size=size,
                    direction=direction,
                )
            assert raised.value.field_violations[0].field == field
        with pytest.raises(InvalidArgument):
            copy(client, segment_id=segment.id, buffer_id=buffer.id, size=4, direction=0)
        np.testing.assert_array_equal(buffer.read(), data)  # nothing moved


VICTIM = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from accy import Client
    client = Client(sys.argv[1], liveness=2)
    buffer = client.buffer(np.ones(1 << 22, np.float32))
    shared = client.shared_array(1 << 22, np.float32)
    buffer.read(out=shared)
    print("READY", flush=True)
    time.sleep(600)
    """
)


def test_a_killed_client_leaves_no_segment_behind(daemon: RunningDaemon, tmp_path: Path) -> None:
    pid = server_pid(daemon)
    with Client(daemon.unix_target) as watcher:
        baseline = watcher.status()
        fds, maps = daemon_fds(pid), daemon_segment_maps(pid)
        script = tmp_path / "victim.py"
        script.write_text(VICTIM)
        victim = subprocess.Popen(
            [sys.executable, str(script), daemon.unix_target], stdout=subprocess.PIPE
        )
        try:
            assert victim.stdout is not None
            assert victim.stdout.readline().strip() == b"READY"
            assert daemon_segment_maps(pid) >= maps + 2  # its two segments, mapped here
            assert watcher.status().clients == baseline.clients + 1
        finally:
            victim.send_signal(signal.SIGKILL)
            victim.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            status = watcher.status()
            settled = (
                daemon_segment_maps(pid) == maps
                and daemon_fds(pid) <= fds
                and status.clients == baseline.clients
                and status.device_memory_in_use == baseline.device_memory_in_use
            )
            if settled:
                break
            time.sleep(0.05)
        assert daemon_segment_maps(pid) == maps, "a segment is still mapped in the daemon"
        assert daemon_fds(pid) <= fds, f"{daemon_fds(pid)} descriptors open, {fds} before"
        assert watcher.status().clients == baseline.clients


def test_a_write_when_segments_ran_out_takes_grpc(daemon: RunningDaemon) -> None:
    """The daemon's segments per client are spent (on shared arrays): a plain write or read
    needs none, so it goes over gRPC rather than failing for a quota the user never set."""
    with Client(daemon.unix_target) as client:
        arrays = []
        with pytest.raises(ResourceExhausted):  # a shared array needs a segment of its own
            for _ in range(MAX_SEGMENTS_PER_CLIENT + 1):
                arrays.append(client.shared_array(16, np.float32))
        assert segments_of(client) == MAX_SEGMENTS_PER_CLIENT
        data = np.random.default_rng(5).standard_normal(N).astype(np.float32)
        with client.buffer(data) as buffer:  # 4 MiB: shared memory, were a segment free
            np.testing.assert_array_equal(buffer.read(), data)
        assert segments_of(client) == MAX_SEGMENTS_PER_CLIENT
        arrays.clear()  # their segments go back: the next large write goes through one


def shared_bytes_of(client: Client) -> _shm.SharedBytes:
    transport = transport_of(client)
    assert isinstance(transport, _link_transport.LinkTransport)
    assert isinstance(transport.bytes, _shm.SharedBytes)
    return transport.bytes


@pytest.mark.parametrize("ring", ["1", "0"])
def test_a_transfer_of_many_pieces_moves_through_two_segments_in_turn(
    daemon: RunningDaemon, ring: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Larger than a piece: through two pooled segments in turn (COPY records, or
    CopySegment calls), progress after each piece, every byte where it belongs."""
    monkeypatch.setattr(_shm, "CHUNK_BYTES", 1 << 20)
    monkeypatch.setenv("ACCY_RING", ring)
    count = (5 << 20) // 4 + 777  # 5 full pieces and a short sixth
    data = np.random.default_rng(11).standard_normal(count).astype(np.float32)
    with Client(daemon.unix_target) as client:
        buffer = client.empty(count + 1024, np.float32)
        seen: list[tuple[int, int]] = []
        assert buffer.write(data, offset=4096, progress=lambda *p: seen.append(p)) == data.nbytes
        assert seen == [(min(k << 20, data.nbytes), data.nbytes) for k in range(1, 7)]
        pool = shared_bytes_of(client).pool
        assert len(pool._segments) == 2  # two segments of a piece each, not one of 5 MiB
        assert all(s.byte_size == _shm.MIN_SEGMENT for s in pool._segments)
        seen.clear()
        got = buffer.read(count=count, offset=4096, progress=lambda *p: seen.append(p))
        np.testing.assert_array_equal(got, data)
        assert seen[-1] == (data.nbytes, data.nbytes) and len(seen) == 6
        into = np.zeros(count + 1024, np.float32)
        buffer.read(out=into)
        np.testing.assert_array_equal(into[1024:], data)
        assert len(pool._segments) == 2 and not any(s.busy for s in pool._segments)


def test_a_piece_the_daemon_refuses_fails_the_transfer_and_frees_the_segments(
    daemon: RunningDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_shm, "CHUNK_BYTES", 1 << 20)
    data = np.arange((6 << 20) // 4, dtype=np.float32)
    with Client(daemon.unix_target) as client:
        buffer = client.empty(data.size, np.float32)
        shared = shared_bytes_of(client)
        copier = shared._copier
        calls: list[int] = []

        def third_refused(request: CopyRequest) -> int:
            calls.append(1)
            if len(calls) == 3:  # a segment id the daemon never gave: it refuses the copy
                request = request._replace(segment_id="seg_not_yours")
            return copier.copy(request)

        monkeypatch.setattr(shared, "_copier", type("C", (), {"copy": staticmethod(third_refused)}))
        with pytest.raises((NotFound, InvalidArgument)):
            buffer.write(data)
        assert len(calls) <= 4  # nothing past the refused piece and the one beside it
        assert not any(s.busy for s in shared.pool._segments)
        monkeypatch.setattr(shared, "_copier", copier)
        buffer.write(data)  # the segments are whole and free: the next transfer works
        np.testing.assert_array_equal(buffer.read(), data)
