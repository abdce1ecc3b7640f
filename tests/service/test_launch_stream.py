"""LaunchStream: many launches on one call, answered by tag, refusals in-band, order kept."""

from __future__ import annotations

import queue
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from accy.protocol.launch.v1 import launch_pb2 as pb
from tests.service.harness import Attached, ServerThread, attach, rpc_error, status_details
from tests.service.test_rpcs import download, upload

N = 50000
RNG = np.random.default_rng(11)


def saxpy(session: str, x: str, y: str, a: float, *, tag: int, wait: bool) -> pb.LaunchRequest:
    return pb.LaunchRequest(
        session_id=session,
        operands=[x, y],
        results=[y],
        runtime_scalars={"n": pb.Scalar(u32=N), "a": pb.Scalar(f32=a)},
        wait=wait,
        tag=tag,
    )


def by_tag(answers: Iterator[pb.LaunchStreamResponse]) -> dict[int, pb.LaunchStreamResponse]:
    found: dict[int, pb.LaunchStreamResponse] = {}
    for answer in answers:
        assert answer.tag not in found, f"tag {answer.tag} answered twice"
        found[answer.tag] = answer
    return found


def test_a_stream_applies_launches_in_its_order_and_answers_each_tag(client: Attached) -> None:
    session = client.LoadPipeline(pb.LoadPipelineRequest(target="accy.kernel.saxpy")).session_id
    x, y = RNG.random(N, dtype=np.float32), RNG.random(N, dtype=np.float32)
    bx, by = upload(client, x), upload(client, y)
    expected = y.copy()
    requests = []
    for step in range(1, 13):
        a = np.float32(0.125 * step)
        expected = a * x + expected
        requests.append(saxpy(session, bx, by, float(a), tag=100 + step, wait=step % 3 == 0))
    answers = by_tag(client.LaunchStream(iter(requests)))
    assert sorted(answers) == [100 + step for step in range(1, 13)]
    for request in requests:
        answer = answers[request.tag]
        assert answer.WhichOneof("outcome") == "launch"
        assert answer.launch.completed == request.wait
    assert len({a.launch.launch_id for a in answers.values()}) == 12
    np.testing.assert_allclose(download(client, by), expected, rtol=1e-5)
    status = client.GetStatus(pb.GetStatusRequest())
    assert status.launches_failed == 0


def test_a_refused_launch_is_answered_in_band_and_the_stream_goes_on(client: Attached) -> None:
    session = client.LoadPipeline(pb.LoadPipelineRequest(target="accy.kernel.saxpy")).session_id
    x, y = RNG.random(N, dtype=np.float32), np.zeros(N, np.float32)
    bx, by = upload(client, x), upload(client, y)
    bad_n = saxpy(session, bx, by, 1.0, tag=2, wait=True)
    bad_n.runtime_scalars["n"].u32 = 0
    unknown = saxpy("ses_nope", bx, by, 1.0, tag=3, wait=True)
    wrong_count = saxpy(session, bx, by, 1.0, tag=4, wait=False)
    del wrong_count.operands[1]
    requests = [
        saxpy(session, bx, by, 1.0, tag=1, wait=True),
        bad_n,
        unknown,
        wrong_count,
        saxpy(session, bx, by, 2.0, tag=5, wait=True),
    ]
    answers = by_tag(client.LaunchStream(iter(requests)))
    assert [answers[t].WhichOneof("outcome") for t in range(1, 6)] == [
        "launch",
        "error",
        "error",
        "error",
        "launch",
    ]
    expected = {
        2: (grpc.StatusCode.INVALID_ARGUMENT, "runtime_scalars.n"),
        3: (grpc.StatusCode.NOT_FOUND, "session_id"),
        4: (grpc.StatusCode.INVALID_ARGUMENT, "operands"),
    }
    for tag, (code, field) in expected.items():
        error = answers[tag].error
        assert error.code == code.value[0], (tag, error)
        found = status_details(error)
        assert found["BadRequest"].field_violations[0].field == field
        assert found["ErrorInfo"].domain == "accy.dev" and found["RequestInfo"].request_id
        assert error.message
    np.testing.assert_allclose(download(client, by), 3 * x, rtol=1e-6)  # only 1 and 5 ran
    assert client.GetStatus(pb.GetStatusRequest()).launches_failed >= 3


def test_a_stream_needs_an_attached_client(channel: grpc.Channel) -> None:
    stub = attach(channel).stub
    error = rpc_error(lambda: list(stub.LaunchStream(iter([pb.LaunchRequest(tag=1)]))))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "accy-client-id" in (error.details() or "")


def test_another_clients_session_and_buffers_are_unknown_in_band(
    client: Attached, channel: grpc.Channel
) -> None:
    session = client.LoadPipeline(pb.LoadPipelineRequest(target="accy.kernel.saxpy")).session_id
    bx = upload(client, np.ones(N, np.float32))
    other = attach(channel, "other")
    try:
        mine = other.LoadPipeline(pb.LoadPipelineRequest(target="accy.kernel.saxpy")).session_id
        requests = [
            saxpy(session, bx, bx, 1.0, tag=1, wait=True),
            saxpy(mine, bx, bx, 1.0, tag=2, wait=True),
        ]
        answers = by_tag(other.LaunchStream(iter(requests)))
        for tag, field in ((1, "session_id"), (2, "operands[0]")):
            assert answers[tag].error.code == grpc.StatusCode.NOT_FOUND.value[0]
            assert status_details(answers[tag].error)["BadRequest"].field_violations[0].field == (
                field
            )
    finally:
        other.detach()


def test_a_cancelled_stream_leaves_nothing_in_flight(
    client: Attached, server: ServerThread
) -> None:
    session = client.LoadPipeline(pb.LoadPipelineRequest(target="accy.kernel.saxpy")).session_id
    bx, by = upload(client, np.ones(N, np.float32)), upload(client, np.zeros(N, np.float32))
    outbox: queue.SimpleQueue[pb.LaunchRequest | None] = queue.SimpleQueue()

    def requests() -> Iterator[pb.LaunchRequest]:
        while (request := outbox.get()) is not None:
            yield request

    call = client.LaunchStream(requests())
    for tag in range(1, 4):  # ping-pong, as the client library does
        outbox.put(saxpy(session, bx, by, 1.0, tag=tag, wait=tag != 2))
        assert next(call).tag == tag
    outbox.put(saxpy(session, bx, by, 1.0, tag=4, wait=True))
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


def flat(answers: Iterator[pb.LaunchStreamResponse]) -> Iterator[pb.LaunchStreamResponse]:
    """Every answer, those a message carries in its ``more`` too."""
    for answer in answers:
        yield answer
        yield from answer.more


def test_a_message_carries_more_launches_in_order_each_answered_once(client: Attached) -> None:
    session = client.LoadPipeline(pb.LoadPipelineRequest(target="accy.kernel.saxpy")).session_id
    x, y = RNG.random(N, dtype=np.float32), RNG.random(N, dtype=np.float32)
    bx, by = upload(client, x), upload(client, y)
    expected = y.copy()
    launches = []
    for step in range(1, 9):
        a = np.float32(0.25 * step)
        expected = a * x + expected
        launches.append(saxpy(session, bx, by, float(a), tag=step, wait=step == 8))
    message = launches[0]
    message.more.extend(launches[1:])
    message.more.append(pb.LaunchRequest(tag=50, ping=True))
    nested = saxpy(session, bx, by, 1.0, tag=60, wait=False)
    nested.more.append(saxpy(session, bx, by, 1.0, tag=61, wait=False))
    message.more.append(nested)
    message.more.append(saxpy(session, "buf_nope", by, 1.0, tag=70, wait=False))
    answers = list(client.LaunchStream(iter([message])))
    assert len(answers) < 11, "the answers ready together should share messages"
    found = by_tag(flat(iter(answers)))
    assert sorted(found) == [*range(1, 9), 50, 60, 70]
    assert all(found[t].WhichOneof("outcome") == "launch" for t in range(1, 9))
    assert found[8].launch.completed
    assert found[50].WhichOneof("outcome") is None  # the ping's answer carries only its tag
    assert found[60].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "`more` of its own" in found[60].error.message  # nested: refused, not launched
    assert found[70].error.code == grpc.StatusCode.NOT_FOUND.value[0]
    np.testing.assert_allclose(download(client, by), expected, rtol=1e-5)
