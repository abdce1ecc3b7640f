"""RingStream as a call: records applied in their order, refusals as entries, the stream goes on.

What ``LaunchStream`` promised, now that the ring record is the one pipelined
encoding of a launch: a session's launches run in the order sent, a refused one
is named (an error entry for its record) and the stream goes on, another
client's ids are unknown, a client must be attached, and a cancelled stream
leaves nothing in flight.
"""

from __future__ import annotations

import itertools
import queue
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from accy.protocol import ring as layout
from accy.protocol.launch.v1 import launch_pb2 as pb
from accyd.ring.ring import ServerRing
from tests.launch_service.harness import Attached, ServerThread, attach, make_config, rpc_error
from tests.launch_service.test_rpcs import download, upload
from tests.waiting import eventually

N = 50000
RNG = np.random.default_rng(11)
SAXPY = "accy.kernel.saxpy"
_SCALARS = struct.Struct(f"<I4xf4x{8 * (layout.MAX_SCALARS - 2)}x")


def bind(seq: int, kind: layout.Kind, handle: int, object_id: str) -> bytes:
    raw = object_id.encode()
    record = layout.RECORD.pack(seq, kind, 0, handle, 0, 0, 0, *([0] * 16), b"")
    return (record + bytes([len(raw)]) + raw).ljust(layout.SLOT_SIZE, b"\0")


def saxpy(seq: int, session: int, x: int, y: int, a: float, *, n: int = N, wait: bool) -> bytes:
    handles = [x, y, y, *([0] * 13)]
    flags = layout.NOTIFY if wait else 0
    scalars = _SCALARS.pack(n, a)
    record = layout.RECORD.pack(seq, layout.Kind.LAUNCH, flags, session, 2, 1, 2, *handles, scalars)
    return record.ljust(layout.SLOT_SIZE, b"\0")


def stream(client: Attached, *bodies: bytes) -> list[pb.RingState]:
    """Open a ring of 64 slots and send each body as a frame; the states that came back."""
    frames, seq = [pb.RingFrame(slots=64)], 0
    for body in bodies:
        frames.append(pb.RingFrame(first=seq, records=body))
        seq += len(body) // layout.SLOT_SIZE
    return list(client.RingStream(iter(frames), timeout=30))


def entries_of(states: list[pb.RingState]) -> list[tuple[int, str, str]]:
    """(record, reason, field) of each error entry the daemon sent."""
    data = b"".join(state.entries for state in states)
    found = []
    for at in range(0, len(data), layout.ERROR_SIZE):
        seq, reason, field, _, _ = layout.ERROR_ENTRY.unpack_from(data, at)
        found.append((seq, reason.rstrip(b"\0").decode(), field.rstrip(b"\0").decode()))
    return found


def loaded(client: Attached) -> tuple[str, str, str, np.ndarray, np.ndarray]:
    session = client.LoadPipeline(pb.LoadPipelineRequest(target=SAXPY)).session_id
    x, y = RNG.random(N, dtype=np.float32), RNG.random(N, dtype=np.float32)
    return session, upload(client, x), upload(client, y), x, y


def test_records_apply_in_their_order_across_frames(client: Attached) -> None:
    session, bx, by, x, y = loaded(client)
    binds = b"".join(
        bind(seq, kind, handle, object_id)
        for seq, (kind, handle, object_id) in enumerate(
            [
                (layout.Kind.BIND_SESSION, 1, session),
                (layout.Kind.BIND_BUFFER, 2, bx),
                (layout.Kind.BIND_BUFFER, 3, by),
            ]
        )
    )
    expected, launches = y.copy(), []
    for step in range(1, 13):
        a = np.float32(0.125 * step)
        expected = a * x + expected
        launches.append(saxpy(2 + step, 1, 2, 3, float(a), wait=step % 3 == 0))
    states = stream(client, binds, b"".join(launches[:5]), b"".join(launches[5:]))
    assert (states[-1].tail, states[-1].done, states[-1].errors) == (15, 15, 0)
    np.testing.assert_allclose(download(client, by), expected, rtol=1e-5)
    assert client.GetStatus(pb.GetStatusRequest()).launches_failed == 0


def test_a_refused_record_is_named_in_an_entry_and_the_stream_goes_on(client: Attached) -> None:
    session, bx, by, x, _ = loaded(client)
    client.WriteBuffer(iter([pb.WriteBufferChunk(buffer_id=by, data=bytes(4 * N))]))
    body = b"".join(
        [
            bind(0, layout.Kind.BIND_SESSION, 1, session),
            bind(1, layout.Kind.BIND_BUFFER, 2, bx),
            bind(2, layout.Kind.BIND_BUFFER, 3, by),
            saxpy(3, 1, 2, 3, 1.0, wait=True),
            saxpy(4, 1, 2, 3, 1.0, n=0, wait=True),  # out of the pipeline's bounds
            saxpy(5, 9, 2, 3, 1.0, wait=True),  # no session bound to handle 9
            saxpy(6, 1, 2, 7, 1.0, wait=False),  # no buffer bound to handle 7
            saxpy(7, 1, 2, 3, 2.0, wait=True),
        ]
    )
    states = stream(client, body)
    found = entries_of(states)
    assert [(seq, reason) for seq, reason, _ in found] == [
        (4, "LAUNCH_ARGUMENT_MISMATCH"),
        (5, "NOT_FOUND"),
        (6, "NOT_FOUND"),
    ]
    assert found[0][2] == "runtime_scalars.n"
    assert (states[-1].tail, states[-1].done) == (8, 8)
    np.testing.assert_allclose(download(client, by), 3 * x, rtol=1e-6)  # only 3 and 7 ran


def test_a_stream_needs_an_attached_client(channel: grpc.Channel) -> None:
    stub = attach(channel).stub
    error = rpc_error(lambda: list(stub.RingStream(iter([pb.RingFrame(slots=16)]))))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "accy-client-id" in (error.details() or "")


def test_another_clients_session_and_buffers_are_unknown(
    client: Attached, channel: grpc.Channel
) -> None:
    session, bx, _, _, _ = loaded(client)
    other = attach(channel, "other")
    try:
        mine = other.LoadPipeline(pb.LoadPipelineRequest(target=SAXPY)).session_id
        body = b"".join(
            [
                bind(0, layout.Kind.BIND_SESSION, 1, session),
                bind(1, layout.Kind.BIND_SESSION, 2, mine),
                bind(2, layout.Kind.BIND_BUFFER, 3, bx),
                saxpy(3, 2, 3, 3, 1.0, wait=True),
            ]
        )
        found = entries_of(stream(other, body))
        assert [(seq, reason) for seq, reason, _ in found[:2]] == [
            (0, "NOT_FOUND"),
            (2, "NOT_FOUND"),
        ]
        assert all(reason == "NOT_FOUND" for _, reason, _ in found)
    finally:
        other.detach()


def test_a_cancelled_stream_leaves_nothing_in_flight(
    client: Attached, server: ServerThread
) -> None:
    session = client.LoadPipeline(pb.LoadPipelineRequest(target=SAXPY)).session_id
    bx, by = upload(client, np.ones(N, np.float32)), upload(client, np.zeros(N, np.float32))
    outbox: queue.SimpleQueue[pb.RingFrame | None] = queue.SimpleQueue()

    def frames() -> Iterator[pb.RingFrame]:
        while (frame := outbox.get()) is not None:
            yield frame

    call = client.RingStream(frames())
    outbox.put(pb.RingFrame(slots=64))
    assert next(call).slots == 64
    binds = [
        bind(0, layout.Kind.BIND_SESSION, 1, session),
        bind(1, layout.Kind.BIND_BUFFER, 2, bx),
        bind(2, layout.Kind.BIND_BUFFER, 3, by),
    ]
    outbox.put(pb.RingFrame(first=0, records=b"".join(binds)))
    for seq in range(3, 6):  # one at a time, as a client that waits on each does
        outbox.put(pb.RingFrame(first=seq, records=saxpy(seq, 1, 2, 3, 1.0, wait=seq != 4)))
        while next(call).done <= seq:
            pass
    outbox.put(pb.RingFrame(first=6, records=saxpy(6, 1, 2, 3, 1.0, wait=True)))
    call.cancel()
    outbox.put(None)
    with pytest.raises(grpc.RpcError):
        for _ in call:
            pass
    assert server.call(server.server.calls.wait_idle(5.0)), "a launch stayed in flight"
    client.WaitLaunch(pb.WaitLaunchRequest(session_id=session))
    assert [t.launches_in_flight for t in client.GetStatus(pb.GetStatusRequest()).tenants] == [0]
    done = download(client, by)
    assert done[0] in (3.0, 4.0) and np.all(done == done[0])  # the 4th ran or was never read


@pytest.mark.parametrize("engine", ["python", "native"])
def test_a_departed_clients_records_are_dropped_not_decided(
    tmp_path: Path, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 clients each sent a ring of refused records and left: the daemon went on refusing
    all 65,536 of them one by one for seconds, their rings held meanwhile."""
    if engine == "native":
        pytest.importorskip("accyd.ring.engine._native")
    refused = 0
    refuse = ServerRing.refuse

    def counted(ring: ServerRing, *args: Any, **kwargs: Any) -> None:
        nonlocal refused
        refused += 1
        refuse(ring, *args, **kwargs)

    monkeypatch.setattr(ServerRing, "refuse", counted)
    running = ServerThread(make_config(tmp_path, "tcp", engine=engine))
    slots = 4096
    body = b"".join(saxpy(seq, 7, 1, 2, 1.0, wait=False) for seq in range(slots))  # no session 7
    calls = []
    outbox: queue.SimpleQueue[pb.RingFrame | None] = queue.SimpleQueue()
    try:
        for _ in range(16):
            channel = grpc.insecure_channel(running.address)
            client = attach(channel)
            frames = [pb.RingFrame(slots=slots), pb.RingFrame(first=0, records=body)]
            call = client.stub.RingStream(  # then open, sending nothing more
                itertools.chain(frames, iter(outbox.get, None)), metadata=client.metadata
            )
            next(call)
            calls.append((channel, call))
        engine_of = running.server.ring_doors
        assert engine_of is not None
        for channel, call in calls:  # the clients go
            call.cancel()
            channel.close()
        at_leaving = refused
        assert eventually(lambda: engine_of.engine.stats()["rings"] == 0, timeout=5.0)
        assert refused - at_leaving < slots, f"{refused - at_leaving} refused after they left"
    finally:
        for _ in calls:
            outbox.put(None)
        running.stop()
