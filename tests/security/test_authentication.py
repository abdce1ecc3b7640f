"""Bearer tokens on every call, scopes, tenants from tokens, and other tenants' ids as unknown."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc  # type: ignore[import-untyped, unused-ignore]

from accy.protocol.launch.v1 import launch_pb2 as pb
from tests.launch_service.harness import ServerThread, details, field_of, rpc_error
from tests.security.harness import Caller, TokenSpec, serving_with_tokens, write_tokens

SCAN = "accy.kernel.device_scan"
SAXPY = "accy.kernel.saxpy"
SPECS = {
    "a": TokenSpec("team-a"),
    "a2": TokenSpec("team-a"),
    "b": TokenSpec("team-b"),
    "reader": TokenSpec("team-r", scopes=()),
    "admin": TokenSpec("ops", scopes=("launch", "admin")),
}


@pytest.fixture(scope="module", params=["unix", "tcp"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerThread, dict[str, str]]]:
    folder = tmp_path_factory.mktemp("auth", numbered=True)
    tokens = write_tokens(folder / "tokens.toml", SPECS)
    running = serving_with_tokens(folder, request.param, folder / "tokens.toml")
    yield running, tokens
    running.stop()


@pytest.fixture
def channel(served: tuple[ServerThread, dict[str, str]]) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(served[0].address) as opened:
        yield opened


@pytest.fixture
def tokens(served: tuple[ServerThread, dict[str, str]]) -> dict[str, str]:
    return served[1]


def refused(call: Callable[[], object], code: grpc.StatusCode, reason: str) -> grpc.RpcError:
    error = rpc_error(call)
    assert error.code() == code, error.details()
    assert details(error)["ErrorInfo"].reason == reason
    return error


@pytest.mark.parametrize("token", [None, "not-a-token"])
def test_a_missing_or_wrong_token_is_unauthenticated_on_every_rpc(
    channel: grpc.Channel, token: str | None
) -> None:
    caller = Caller(channel, token)
    unauthenticated = grpc.StatusCode.UNAUTHENTICATED
    refused(lambda: caller.attach(), unauthenticated, "UNAUTHENTICATED")
    refused(
        lambda: caller.ListPipelines(pb.ListPipelinesRequest()), unauthenticated, "UNAUTHENTICATED"
    )
    refused(lambda: caller.GetStatus(pb.GetStatusRequest()), unauthenticated, "UNAUTHENTICATED")
    refused(lambda: caller.Run(pb.RunRequest(target=SCAN)), unauthenticated, "UNAUTHENTICATED")


def test_a_malformed_authorization_header_is_unauthenticated(
    channel: grpc.Channel, tokens: dict[str, str]
) -> None:
    caller = Caller(channel)
    metadata = (("authorization", f"Basic {tokens['a']}"),)
    error = refused(
        lambda: caller.stub.GetStatus(pb.GetStatusRequest(), metadata=metadata),
        grpc.StatusCode.UNAUTHENTICATED,
        "UNAUTHENTICATED",
    )
    assert "Bearer" in (error.details() or "")


def test_a_token_without_the_launch_scope_is_permission_denied(
    channel: grpc.Channel, tokens: dict[str, str]
) -> None:
    caller = Caller(channel, tokens["reader"])
    refused(lambda: caller.attach(), grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED")


def test_health_and_reflection_need_no_token(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    reply = health.Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    answer = next(iter(reflection.ServerReflectionInfo(iter([request]), timeout=10)))
    names = {service.name for service in answer.list_services_response.service}
    assert "accy.launch.v1.LaunchService" in names


def test_the_tenant_comes_from_the_token(channel: grpc.Channel, tokens: dict[str, str]) -> None:
    caller = Caller(channel, tokens["b"])
    try:
        assert caller.attach().tenant == "team-b"
        status = caller.status()
        assert status.tenant == "team-b"
        assert [tenant.name for tenant in status.tenants] == ["team-b"]
    finally:
        caller.detach()


def test_another_tenants_client_id_is_answered_as_an_unknown_one(
    channel: grpc.Channel, tokens: dict[str, str]
) -> None:
    owner = Caller(channel, tokens["a"])
    owner.attach()
    try:
        session = owner.load(SCAN)
        buffer = owner.buffer(64)
        intruder = Caller(channel, tokens["b"], client_id=owner.client_id)
        unknown = Caller(channel, tokens["b"], client_id="cli_" + "x" * 24)
        for request_of in (
            lambda c: c.ReadBuffer(pb.ReadBufferRequest(buffer_id=buffer)).__next__(),
            lambda c: c.FreeBuffer(pb.FreeBufferRequest(buffer_id=buffer)),
            lambda c: c.Release(pb.ReleaseRequest(session_id=session)),
            lambda c: c.AllocateBuffer(pb.AllocateBufferRequest(byte_size=64)),
        ):
            theirs, nobodys = (
                refused(partial(request_of, caller), grpc.StatusCode.NOT_FOUND, "CLIENT_UNKNOWN")
                for caller in (intruder, unknown)
            )
            same = (nobodys.details() or "").replace(str(unknown.client_id), str(owner.client_id))
            assert theirs.details() == same
            assert field_of(theirs) == field_of(nobodys) == "client_id"
        # The owner still has everything.
        owner.FreeBuffer(pb.FreeBufferRequest(buffer_id=buffer))
        owner.Release(pb.ReleaseRequest(session_id=session))
    finally:
        owner.detach()


def test_another_clients_session_and_buffer_ids_are_not_found(
    channel: grpc.Channel, tokens: dict[str, str]
) -> None:
    owner, other = Caller(channel, tokens["a"]), Caller(channel, tokens["b"])
    owner.attach()
    other.attach()
    try:
        session, buffer = owner.load(SCAN), owner.buffer(64)
        refused(
            lambda: other.FreeBuffer(pb.FreeBufferRequest(buffer_id=buffer)),
            grpc.StatusCode.NOT_FOUND,
            "NOT_FOUND",
        )
        refused(
            lambda: other.WaitLaunch(pb.WaitLaunchRequest(session_id=session)),
            grpc.StatusCode.NOT_FOUND,
            "NOT_FOUND",
        )
    finally:
        owner.detach()
        other.detach()


def test_clients_of_one_tenant_share_its_usage_and_only_admins_see_every_tenant(
    channel: grpc.Channel, tokens: dict[str, str]
) -> None:
    first, second = Caller(channel, tokens["a"]), Caller(channel, tokens["a2"])
    admin = Caller(channel, tokens["admin"])
    first.attach()
    second.attach()
    try:
        first.load(SCAN)
        second.load(SAXPY)
        second.buffer(256)
        (mine,) = first.status().tenants
        assert (mine.name, mine.clients, mine.sessions, mine.buffers) == ("team-a", 2, 2, 1)
        assert mine.memory_bytes >= 256
        everyone = {tenant.name for tenant in admin.status().tenants}
        assert {"team-a"} <= everyone
        assert admin.status().tenant == "ops"
    finally:
        first.detach()
        second.detach()
