"""A device fault in a live server: NOT_SERVING, then every call UNAVAILABLE naming the session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from accy.protocol.launch.v1 import launch_pb2 as pb
from accyd.catalog import load_catalog
from accyd.server import EXIT_DEVICE_FAULT
from tests.launch_service.harness import ServerThread, details, make_config
from tests.launch_service.test_lifecycle import eventually
from tests.security.harness import Caller

FAULTY = Path(__file__).parents[1] / "catalogs" / "faulty"


@pytest.fixture
def faulted(tmp_path: Path) -> Iterator[tuple[ServerThread, Caller, str, grpc.RpcError]]:
    running = ServerThread(make_config(tmp_path, "unix"), load_catalog([FAULTY]))
    channel = grpc.insecure_channel(running.address)
    victim = Caller(channel)
    victim.attach()
    session = victim.load("accy.test.fault")
    x, y = victim.buffer(16), victim.buffer(16)
    launch = pb.LaunchRequest(
        session_id=session, operands=[x], results=[y],
        runtime_scalars={"n": pb.Scalar(u32=4)}, wait=True,
    )  # fmt: skip
    with pytest.raises(grpc.RpcError) as caught:
        victim.Launch(launch)
    try:
        yield running, victim, session, caught.value
    finally:
        victim.detach()
        channel.close()
        running.stop()


def test_health_goes_not_serving_and_every_call_names_the_session(
    faulted: tuple[ServerThread, Caller, str, grpc.RpcError],
) -> None:
    running, victim, session, error = faulted
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    info = details(error)["ErrorInfo"]
    assert (info.reason, info.metadata["session"]) == ("DEVICE_LOST", session)
    health = health_pb2_grpc.HealthStub(victim.channel)
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    assert eventually(
        lambda: health.Check(health_pb2.HealthCheckRequest()).status == not_serving, 2.0
    )
    assert running.server.exit_code == EXIT_DEVICE_FAULT
    for call in (
        lambda: victim.buffer(16),
        lambda: victim.load("accy.kernel.saxpy"),
        lambda: victim.WaitLaunch(pb.WaitLaunchRequest(session_id=session)),
    ):
        with pytest.raises(grpc.RpcError) as caught:
            call()
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        info = details(caught.value)["ErrorInfo"]
        assert (info.reason, info.metadata["session"]) == ("DEVICE_LOST", session)
    assert running.server.metrics.device_faults._value.get() == 1
