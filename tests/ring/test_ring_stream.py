"""The ring over a stream (RingStream): remote launches as ring records, checked the same way."""

from __future__ import annotations

import queue
import struct
import threading
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accy import errors
from accy.client import Client
from accy.protocol import ring as layout
from accy.protocol.launch.v1 import launch_pb2 as pb
from accy.testing import RunningDaemon, running_daemon, transport_of
from accyd.backends.cuda import cuda_available
from accyd.ring.stream import STREAMS_PER_CLIENT

SAXPY = "accy.kernel.saxpy"


@pytest.fixture(
    scope="module",
    params=[
        "host",
        pytest.param(
            "cuda",
            marks=[
                pytest.mark.cuda,
                pytest.mark.skipif(not cuda_available(), reason="no CUDA driver or device here"),
            ],
        ),
    ],
)
def daemon(request: pytest.FixtureRequest) -> Iterator[RunningDaemon]:
    with running_daemon(backend=request.param) as running:
        yield running
        assert running.process.poll() is None, running.log_text()


@pytest.fixture
def client(daemon: RunningDaemon) -> Iterator[Client]:
    assert daemon.tcp_target is not None
    with Client(daemon.tcp_target, client_name="ring-stream") as client:
        yield client


def test_tcp_launches_go_through_the_ring_stream_in_order(client: Client) -> None:
    n = 256
    x, y = client.buffer(np.ones(n, np.float32)), client.buffer(np.zeros(n, np.float32))
    session = client.load(SAXPY)
    launches = [session.launch([x, y], [y], wait=False, n=n, a=0.25) for _ in range(400)]
    session.wait()
    assert all(launch.completed or launch.wait() is launch for launch in launches)
    np.testing.assert_array_equal(y.read(), np.full(n, 100.0, np.float32))
    waited = session.launch([x, y], [y], n=n, a=1.0)
    assert waited.completed
    assert transport_of(client).path == "ring-stream"  # every launch, a record


def test_a_refused_record_is_raised_by_the_next_wait_naming_it(client: Client) -> None:
    n = 64
    x, y = client.buffer(np.ones(n, np.float32)), client.empty(n, "f32")
    session = client.load(SAXPY)
    bad = session.launch([x, x], [y], wait=False, n=n + 1, a=1.0)  # more than the buffers hold
    with pytest.raises(errors.InvalidArgument) as caught:
        session.wait()
    assert f"ring record {bad.record}" in str(caught.value) and session.id in str(caught.value)
    session.launch([x, x], [y], n=n, a=1.0)  # reported once; the session works on
    np.testing.assert_array_equal(y.read(), np.full(n, 2.0, np.float32))


def test_another_clients_buffer_is_not_found_through_the_stream(
    daemon: RunningDaemon, client: Client
) -> None:
    assert daemon.tcp_target is not None
    with Client(daemon.tcp_target, client_name="other") as other:
        theirs = other.buffer(np.ones(8, np.float32))
        session = client.load(SAXPY)
        mine = client.empty(8, "f32")
        with pytest.raises(errors.NotFound) as caught:
            session.launch([theirs.id, theirs.id], [mine], n=8, a=1.0)
        assert "ring record" in str(caught.value)
        np.testing.assert_array_equal(theirs.read(), np.ones(8, np.float32))


def _raw_stream(client: Client, frames: list[pb.RingFrame]) -> list[pb.RingState]:
    """Send ``frames`` on a RingStream of ``client``'s link; the states that came back."""
    conn = client._conn
    link = conn.current_link(None)
    call = conn.stub.RingStream(iter(frames), metadata=link.metadata, timeout=10)
    return list(call)


def _record(seq: int, handle: int = 1) -> bytes:
    raw = layout.RECORD.pack(seq, layout.Kind.LAUNCH, 0, handle, 0, 0, 0, *([0] * 16), b"")
    return raw.ljust(layout.SLOT_SIZE, b"\0")


@pytest.mark.parametrize(
    ("frame", "why"),
    [
        (pb.RingFrame(first=5, records=_record(5)), "from seq 0"),
        (pb.RingFrame(first=0, records=b"\1" * 100), "whole records"),
        (pb.RingFrame(first=0, records=b"".join(_record(s) for s in range(17))), "at most 16"),
    ],
)
def test_a_frame_that_breaks_the_framing_ends_the_stream(
    client: Client, frame: pb.RingFrame, why: str
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        _raw_stream(client, [pb.RingFrame(slots=16), frame])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert why in (caught.value.details() or "")
    session = client.load(SAXPY)  # the daemon serves on
    x = client.buffer(np.ones(8, np.float32))
    session.launch([x, x], [x], n=8, a=1.0)
    np.testing.assert_array_equal(x.read(), np.full(8, 2.0, np.float32))


def test_hostile_records_are_refused_one_by_one_in_entries(client: Client) -> None:
    rng = np.random.default_rng(3)
    garbage = [bytes(rng.integers(0, 256, layout.SLOT_SIZE, dtype=np.uint8)) for _ in range(6)]
    unbound = _record(6, handle=99)
    records = b"".join(struct.pack("<Q", s) + g[8:] for s, g in enumerate(garbage)) + unbound
    states = _raw_stream(client, [pb.RingFrame(slots=16), pb.RingFrame(first=0, records=records)])
    assert states[0].slots == 16
    last = states[-1]
    assert (last.tail, last.done, last.errors) == (7, 7, 7)  # each refused, none launched
    entries = b"".join(s.entries for s in states)
    assert len(entries) == 7 * layout.ERROR_SIZE
    fields = [layout.ERROR_ENTRY.unpack_from(entries, i * layout.ERROR_SIZE) for i in range(7)]
    assert [f[0] for f in fields] == list(range(7))  # each names its record
    assert fields[-1][1].rstrip(b"\0") == b"NOT_FOUND"  # no session bound to handle 99
    assert {f[1].rstrip(b"\0") for f in fields} <= {b"INVALID_REQUEST", b"NOT_FOUND"}


def test_a_client_holds_at_most_eight_ring_streams(client: Client) -> None:
    conn = client._conn
    link = conn.current_link(None)
    outboxes: list[queue.SimpleQueue[pb.RingFrame | None]] = []
    calls = []
    try:
        for _ in range(STREAMS_PER_CLIENT):
            outbox: queue.SimpleQueue[pb.RingFrame | None] = queue.SimpleQueue()
            outbox.put(pb.RingFrame(slots=16))
            call = conn.stub.RingStream(iter(outbox.get, None), metadata=link.metadata)
            assert next(call).slots == 16  # open
            outboxes.append(outbox)
            calls.append(call)
        with pytest.raises(grpc.RpcError) as caught:
            _raw_stream(client, [pb.RingFrame(slots=16)])
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        for outbox in outboxes:
            outbox.put(None)  # half-close: each stream ends
        for call in calls:
            assert list(call) == []
    assert _raw_stream(client, [pb.RingFrame(slots=16)])[0].slots == 16  # one may open again


def test_the_first_frame_must_open_the_ring(client: Client) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        _raw_stream(client, [pb.RingFrame(slots=3)])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "power of two" in (caught.value.details() or "")


def test_a_daemon_without_rings_keeps_tcp_launches_on_unary_calls() -> None:
    with (
        running_daemon(backend="host", extra=["--no-rings"]) as daemon,
        Client(str(daemon.tcp_target), client_name="no-rings") as client,
    ):
        x = client.buffer(np.ones(8, np.float32))
        session = client.load(SAXPY)
        session.launch([x, x], [x], wait=False, n=8, a=1.0)
        session.wait()
        np.testing.assert_array_equal(x.read(), np.full(8, 2.0, np.float32))
        assert transport_of(client).path == "unary"


_SLOTS = 16


@st.composite
def _frames(draw: st.DrawFn) -> list[pb.RingFrame]:
    """Frames a hostile client might send: records of any bytes (their seqs mostly right,
    so they reach the checks), framing mostly whole, sometimes not."""
    frames, seq = [], 0
    for _ in range(draw(st.integers(1, 4))):
        count = draw(st.integers(0, _SLOTS))
        body = b""
        for index in range(count):
            raw = draw(st.binary(min_size=layout.SLOT_SIZE, max_size=layout.SLOT_SIZE))
            right = draw(st.booleans())
            body += (struct.pack("<Q", seq + index) + raw[8:]) if right else raw
        if draw(st.integers(0, 9)) == 0:
            body += draw(st.binary(min_size=1, max_size=300))  # not whole records
        first = seq if draw(st.integers(0, 9)) else draw(st.integers(0, 1 << 40))
        frames.append(pb.RingFrame(first=first, records=body))
        seq += count
    return frames


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(frames=_frames())
def test_any_frames_are_taken_or_refused_and_the_daemon_serves_on(
    client: Client, frames: list[pb.RingFrame]
) -> None:
    try:
        states = _raw_stream(client, [pb.RingFrame(slots=_SLOTS), *frames])
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
        assert "whole records" in (error.details() or "")
    else:
        sent = sum(len(frame.records) // layout.SLOT_SIZE for frame in frames)
        last = states[-1]
        assert last.slots == _SLOTS or (last.tail, last.done) == (sent, sent)
        assert last.errors <= sent  # a record is refused at most once
    assert any(info.target == SAXPY for info in client.pipelines())  # it serves on


def test_a_stream_the_daemon_ended_lets_its_threads_go() -> None:
    """The call's sending thread (gRPC's, asleep in the record iterator) and the reader both
    end once the daemon is gone."""
    with running_daemon(backend="host") as daemon:
        client = Client(str(daemon.tcp_target), client_name="ended", reattach_timeout=0.5)
        x = client.buffer(np.ones(8, np.float32))
        session = client.load(SAXPY)
        before = set(threading.enumerate())
        session.launch([x, x], [x], n=8, a=1.0)  # opens the ring stream: two threads
        started = set(threading.enumerate()) - before
        assert {t.name for t in started} >= {"accy-ring-stream"} and len(started) >= 2
    deadline = time.monotonic() + 10
    while any(t.is_alive() for t in started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [t.name for t in started if t.is_alive()]
    client.close()
