"""The client library's launches through the ring: kept records, new values, freed buffers."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from accy import Client
from accy._ring_path import RingLaunches
from accy.errors import AccyError, BufferLost, ClientClosed, InvalidArgument, Unavailable
from accy.protocol.ring import RING_ENV
from accy.testing import transport_of
from tests.launch_service.harness import ServerThread, make_config

SAXPY = "accy.kernel.saxpy"
N = 64


@pytest.fixture
def served(tmp_path: Path) -> Iterator[ServerThread]:
    server = ServerThread(make_config(tmp_path, "unix"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def client(served: ServerThread) -> Iterator[Client]:
    with Client(served.address, client_name="ring-client") as made:
        yield made


def ring_of(client: Client) -> RingLaunches:
    """The client's launches through its ring (opened by its first launch)."""
    transport = transport_of(client)
    launches = getattr(transport, "launches", None)
    assert isinstance(launches, RingLaunches), f"launches went {transport.path}"
    return launches


def records_made(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the packed records made (lookups, checks and binds), from now on."""
    made: list[int] = []
    record = RingLaunches._record

    def counted(self: RingLaunches, *args: object) -> object:
        made.append(1)
        return record(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(RingLaunches, "_record", counted)
    return made


def test_each_launch_carries_its_own_scalars_on_a_kept_record(client: Client) -> None:
    x = client.buffer(np.arange(N, dtype=np.float32))
    y = client.buffer(np.ones(N, np.float32))
    out = [client.empty(N, "f32") for _ in range(3)]
    session = client.load(SAXPY)
    for _ in range(3):  # the same buffers and scalars again: one kept record
        session.launch([x, y], [out[0]], wait=False, n=N, a=2.0)
    session.launch([x, y], [out[1]], wait=False, n=N, a=-3.0)
    session.launch([x, y], [out[2]], wait=False, n=N // 2, a=0.5)  # only the first half
    last = session.launch([x, y], [out[0]], wait=True, n=N, a=4.0)
    assert last.completed and last.record is not None, "the launches went through the ring"
    assert f"ring record {last.record}" in repr(last)
    # A record gets no answer of its own: no daemon id or timings are made up for it.
    assert last.id is None and last.enqueue_seconds is None and last.elapsed_seconds is None
    xs = np.arange(N, dtype=np.float32)
    np.testing.assert_array_equal(out[0].read(), 4.0 * xs + 1.0)
    np.testing.assert_array_equal(out[1].read(), -3.0 * xs + 1.0)
    np.testing.assert_array_equal(out[2].read()[: N // 2], 0.5 * xs[: N // 2] + 1.0)
    assert len(ring_of(client)._records) == 3  # one record kept per set of buffers


def test_a_freed_buffer_takes_its_kept_records_with_it(client: Client) -> None:
    x = client.buffer(np.full(N, 2.0, np.float32))
    y = client.buffer(np.ones(N, np.float32))
    z = client.empty(N, "f32")
    session = client.load(SAXPY)
    session.launch([x, y], [z], wait=True, n=N, a=1.0)
    ring = ring_of(client)
    assert ring._records
    z.free()
    assert not ring._records and z.id not in ring._buffers
    again = client.empty(N, "f32")
    session.launch([x, y], [again], wait=True, n=N, a=3.0)
    np.testing.assert_array_equal(again.read(), np.full(N, 7.0, np.float32))


def test_a_missing_scalar_is_named_before_anything_is_sent_and_later_launches_run(
    client: Client,
) -> None:
    x = client.buffer(np.ones(N, np.float32))
    y = client.buffer(np.ones(N, np.float32))
    z = client.empty(N, "f32")
    session = client.load(SAXPY)
    session.launch([x, y], [z], wait=True, n=N, a=1.0)  # the record is kept
    head = ring_of(client).ring.head
    with pytest.raises(InvalidArgument) as raised:
        session.launch([x, y], [z], wait=False, n=N)  # no a
    assert "needs runtime scalar 'a'" in str(raised.value)
    assert raised.value.reason == "LAUNCH_ARGUMENT_MISMATCH"
    assert ring_of(client).ring.head == head, "a launch missing a scalar was published"
    session.launch([x, y], [z], wait=True, n=N, a=5.0)
    np.testing.assert_array_equal(z.read(), np.full(N, 6.0, np.float32))


@pytest.mark.parametrize("way", ["1", "stream", "0"])
def test_a_missing_scalar_gets_the_same_message_on_every_path(
    served: ServerThread, monkeypatch: pytest.MonkeyPatch, way: str
) -> None:
    monkeypatch.setenv(RING_ENV, way)
    with Client(served.address, client_name="missing") as client:
        x = client.buffer(np.ones(N, np.float32))
        session = client.load(SAXPY)
        for _ in range(2):  # a link's first launch, and a later one
            with pytest.raises(InvalidArgument) as raised:
                session.launch([x, x], [x], n=N)
            assert raised.value.message == f"{SAXPY} needs runtime scalar 'a' (f32)"
            assert raised.value.fields == ("runtime_scalars[a]",)
            session.launch([x, x], [x], n=N, a=0.0)
        assert (
            transport_of(client).path == {"1": "ring", "stream": "ring-stream", "0": "unary"}[way]
        )


def test_a_session_relaunches_on_the_same_buffers_and_sees_any_change(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ring's kept record serves a launch on the very same buffers; another buffer in
    the same list, a freed one, or a new object where a collected one was, all miss it."""
    x = client.buffer(np.arange(N, dtype=np.float32))
    y = client.buffer(np.ones(N, np.float32))
    w = client.buffer(np.full(N, 10.0, np.float32))
    z = client.empty(N, "f32")
    session = client.load(SAXPY)
    operands = [x, y]
    session.launch(operands, [z], wait=True, n=N, a=1.0)
    made = records_made(monkeypatch)
    session.launch(operands, [z], wait=True, n=N, a=2.0)
    assert not made, "the same buffers again: the kept record served"
    xs = np.arange(N, dtype=np.float32)
    np.testing.assert_array_equal(z.read(), 2.0 * xs + 1.0)
    operands[1] = w  # the same list, another buffer in it
    session.launch(operands, [z], wait=True, n=N, a=2.0)
    np.testing.assert_array_equal(z.read(), 2.0 * xs + 10.0)
    assert len(made) == 1

    y.free()
    with pytest.raises(AccyError) as raised:  # refused here, before anything is published
        session.launch([x, y], [z], wait=True, n=N, a=1.0)
    assert raised.value.reason == "BUFFER_FREED"
    del raised  # its traceback holds the frames that held the buffers

    # A buffer collected unfreed unbinds its handle, which the kept plan sees: so a new
    # object that CPython puts at the dead buffer's address cannot pass for it.
    session.launch([x, w], [z], wait=True, n=N, a=1.0)
    ring = ring_of(client)
    (kept,) = ring._records.values()
    collected = weakref.ref(z)
    del z
    assert collected() is None
    assert ring.epoch != kept.epoch, "a collected buffer left the kept record good"
    z = client.empty(N, "f32")
    session.launch([x, w], [z], wait=True, n=N, a=3.0)
    np.testing.assert_array_equal(z.read(), 3.0 * xs + 10.0)


def test_ids_given_as_strings_are_not_kept(client: Client) -> None:
    x = client.buffer(np.ones(N, np.float32))
    y = client.buffer(np.ones(N, np.float32))
    z = client.empty(N, "f32")
    session = client.load(SAXPY)
    session.launch([x.id, y], [z], wait=True, n=N, a=1.0)
    assert not ring_of(client)._records, "an id string holds no handle: it could be any buffer"
    session.launch([x, y], [z], wait=True, n=N, a=5.0)
    assert len(ring_of(client)._records) == 1
    np.testing.assert_array_equal(z.read(), np.full(N, 6.0, np.float32))


def test_released_sessions_and_freed_buffers_leave_no_handle_on_either_side(
    served: ServerThread, client: Client
) -> None:
    """A long-lived client that loads and releases sessions (and makes and frees buffers)
    keeps a handful of handles bound on its ring, not one per session it ever had."""
    x = client.buffer(np.ones(N, np.float32))
    for round_ in range(20):
        session = client.load(SAXPY)
        y = client.buffer(np.full(N, float(round_), np.float32))
        z = client.empty(N, "f32")
        session.launch([x, y], [z], wait=True, n=N, a=1.0)
        np.testing.assert_array_equal(z.read(), np.full(N, round_ + 1.0, np.float32))
        y.free()
        z.free()
        if round_ % 2:
            session.release()
        else:
            del session  # the safety net releases it
    path = ring_of(client)
    assert len(path._sessions) <= 1 and len(path._buffers) <= 2, (path._sessions, path._buffers)
    client.load(SAXPY).launch([x, x], [x], wait=True, n=N, a=0.0)  # the ring took the unbinds
    rings = served.server.rings
    assert rings is not None
    (ring,) = [r for r in rings._by_client[client.client_id].values()]
    assert len(ring._sessions) <= 2 and len(ring._buffers) <= 3, (ring._sessions, ring._buffers)


def test_a_bad_scalar_on_a_first_launch_is_refused_before_a_ring_opens(client: Client) -> None:
    x = client.buffer(np.ones(N, np.float32))
    session = client.load(SAXPY)
    transport = transport_of(client)
    assert transport.path == "pending"
    with pytest.raises(AccyError) as raised:
        session.launch([x, x], [x], wait=True, n=N, a=1.0, alpha=2.0)
    assert "alpha" in str(raised.value)
    assert transport.path == "pending", "the refused launch opened a ring"
    session.launch([x, x], [x], wait=True, n=N, a=1.0)
    assert transport.path == "ring"
    np.testing.assert_array_equal(x.read(), np.full(N, 2.0, np.float32))


def test_a_buffer_its_device_took_is_lost_on_the_next_launch_not_later(client: Client) -> None:
    """A buffer marked lost (a fault took its device) makes the kept plan stale: the next
    launch on it raises ``BufferLost`` itself, as a launch with no kept plan does."""
    x = client.buffer(np.ones(N, np.float32))
    z = client.empty(N, "f32")
    session = client.load(SAXPY)
    session.launch([x, x], [z], wait=True, n=N, a=1.0)
    assert ring_of(client)._records
    fault = Unavailable("device 0 faulted", reason="DEVICE_LOST", metadata={"session": "ses_x"})
    assert isinstance(z._lose_device(fault), BufferLost)
    with pytest.raises(BufferLost) as raised:
        session.launch([x, x], [z], wait=False, n=N, a=1.0)
    assert raised.value.metadata.get("session") == "ses_x"


def test_a_launch_after_close_says_the_client_was_closed(served: ServerThread) -> None:
    client = Client(served.address, client_name="closed")
    x = client.buffer(np.ones(N, np.float32))
    session = client.load(SAXPY)
    session.launch([x, x], [x], n=N, a=1.0)  # the ring is open, and the record kept
    client.close()
    with pytest.raises(ClientClosed, match="is closed") as raised:
        session.launch([x, x], [x], n=N, a=1.0)
    assert "launch it again" not in str(raised.value) and raised.value.reason == "CLIENT_CLOSED"
