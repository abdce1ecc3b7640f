"""The client's seam, seen through ``accy.testing.FakeTransport``: what each API call hands
the transport, and what the client does with what the transport answers or raises."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from accy.client import UNSET, Client
from accy.errors import BufferLost, InvalidArgument, Unavailable
from accy.protocol import DEVICE_LOST, DEVICE_SCOPE
from accy.testing import FakeTransport, LaunchRequest, ReadRequest, WaitRequest, WriteRequest
from tests.client.fake_daemon import SCAN, FakeLaunchService


@pytest.fixture
def wire() -> FakeTransport:
    return FakeTransport()


@pytest.fixture
def faked(fake: tuple[str, FakeLaunchService], wire: FakeTransport) -> Iterator[Client]:
    """A client whose control calls go to the double and whose data plane is ``wire``."""
    with Client(fake[0], client_name="faked", transport=wire) as client:
        yield client


def test_a_launch_hands_the_transport_one_request_and_wraps_its_ticket(
    faked: Client, wire: FakeTransport
) -> None:
    session = faked.load(SCAN.target)
    data = faked.empty(8, "u32")
    launch = session.launch([data], [data], wait=False, n=8)
    (request,) = wire.launches()
    assert request == LaunchRequest(session, [data], [data], {"n": 8}, False, UNSET)
    assert (launch.id, launch.completed, launch.record) == ("fake-1", False, None)
    launch.wait(timeout=3.0)
    waited = wire.requests[-1]
    assert isinstance(waited, WaitRequest) and waited.timeout == 3.0
    assert waited.ticket is not None and waited.ticket.launch_id == "fake-1"
    assert launch.completed
    session.wait()
    assert wire.requests[-1] == WaitRequest(None, session.id, UNSET)  # the client's timeout


def test_a_bad_scalar_is_refused_before_the_transport_answers(
    faked: Client, wire: FakeTransport
) -> None:
    session = faked.load(SCAN.target)
    with pytest.raises(InvalidArgument, match="alpha"):
        session.launch(n=8, alpha=1.0)
    assert faked.status() is not None  # the client goes on


def test_bytes_go_through_the_transport_and_come_back_shaped(
    faked: Client, wire: FakeTransport, fake: tuple[str, FakeLaunchService]
) -> None:
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    buffer = faked.buffer(array)
    (write,) = [r for r in wire.requests if isinstance(r, WriteRequest)]
    assert (write.buffer_id, write.offset, bytes(write.data)) == (buffer.id, 0, array.tobytes())
    assert fake[1].state.buffers[buffer.id][1] == bytearray(array.nbytes)  # no WriteBuffer call
    np.testing.assert_array_equal(buffer.read(), array)
    tail = buffer.read(count=2, offset=40)
    np.testing.assert_array_equal(tail, [10.0, 11.0])
    assert wire.requests[-1] == ReadRequest(
        buffer.id, 0, 40, 8, None, faked.timeout, faked.chunk_size, None
    )


def test_a_device_lost_under_a_transfer_loses_the_buffer_and_forgets_it(
    faked: Client, wire: FakeTransport
) -> None:
    buffer = faked.empty(4, "f32")
    fault = Unavailable(
        "device 0 faulted",
        reason=DEVICE_LOST,
        metadata={"scope": DEVICE_SCOPE, "device": "0", "session": "ses_x"},
    )
    wire.fail_next(fault)
    with pytest.raises(BufferLost) as lost:
        buffer.read()
    assert buffer.lost and lost.value.metadata.get("session") == "ses_x"
    assert wire.forgotten == [buffer.id]  # the ring's records naming it go stale
    with pytest.raises(BufferLost):
        buffer.write(np.zeros(4, np.float32))


def test_releasing_and_freeing_forget_the_ids_before_the_daemon_hears(
    faked: Client, wire: FakeTransport, fake: tuple[str, FakeLaunchService]
) -> None:
    session = faked.load(SCAN.target)
    buffer = faked.empty(4, "f32")
    buffer.free()
    session.release()
    assert wire.forgotten == [buffer.id, session.id]
    assert buffer.id not in fake[1].state.buffers and session.id not in fake[1].state.sessions
