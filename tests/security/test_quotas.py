"""Quotas per tenant: each refusal is RESOURCE_EXHAUSTED naming the quota, and nothing leaks."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc
import numpy as np
import pytest

from accy.protocol.launch.v1 import launch_pb2 as pb
from accyd.core.tenants import Quotas
from tests.launch_service.harness import ServerThread, chunks, details, make_config, rpc_error
from tests.security.harness import Caller, TokenSpec, write_tokens

SCAN = "accy.kernel.device_scan"
SAXPY = "accy.kernel.saxpy"
N = 1 << 20
SPECS = {
    "memory": TokenSpec("t-memory", quotas={"memory_bytes": 9 * N}),
    "sessions": TokenSpec("t-sessions", quotas={"sessions": 1}),
    "buffers": TokenSpec("t-buffers", quotas={"buffers": 2}),
    "launches": TokenSpec("t-launches", quotas={"launches_in_flight": 1}),
}


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ServerThread, dict[str, str]]]:
    folder = tmp_path_factory.mktemp("quotas")
    tokens = write_tokens(folder / "tokens.toml", SPECS)
    config = make_config(
        folder, "unix", tokens_file=folder / "tokens.toml", unix_trusted=True,
        quotas=Quotas(buffers=3),
    )  # fmt: skip
    running = ServerThread(config)
    yield running, tokens
    running.stop()


@pytest.fixture
def caller(
    request: pytest.FixtureRequest, served: tuple[ServerThread, dict[str, str]]
) -> Iterator[Caller]:
    running, tokens = served
    with grpc.insecure_channel(running.address) as channel:
        attached = Caller(channel, tokens.get(request.param))
        attached.attach()
        yield attached
        attached.detach()


def refused_by(quota: str, call: Callable[[], object]) -> None:
    names_quota(rpc_error(call), quota)


def names_quota(error: grpc.RpcError, quota: str) -> None:
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
    found = details(error)
    assert found["ErrorInfo"].reason == "QUOTA_EXCEEDED"
    assert found["ErrorInfo"].metadata["quota"] == quota
    assert [v.subject for v in found["QuotaFailure"].violations] == [quota]


def usage(caller: Caller) -> pb.TenantStatus:
    (tenant,) = caller.status().tenants
    return tenant


@pytest.mark.parametrize("caller", ["memory"], indirect=True)
def test_memory_quota(caller: Caller, served: tuple[ServerThread, dict[str, str]]) -> None:
    before = served[0].backend.memory_in_use()
    ids = [caller.buffer(4 * N) for _ in range(2)]
    refused_by("memory_bytes", lambda: caller.buffer(8 * N))
    session = caller.load(SCAN)
    scalars = {"n": pb.Scalar(u32=1 << 30)}  # 2 MiB of scratch: past the 1 MiB left
    refused_by(
        "memory_bytes",
        lambda: caller.AllocateIntermediates(
            pb.AllocateIntermediatesRequest(session_id=session, runtime_scalars=scalars)
        ),
    )
    tenant = usage(caller)
    assert (tenant.memory_bytes, tenant.buffers) == (8 * N, 2)
    assert tenant.quota_refusals["memory_bytes"] == 2
    assert tenant.quotas.memory_bytes == 9 * N and not tenant.quotas.HasField("sessions")
    assert tenant.quotas.buffers == 3  # left out of the token: the default
    for buffer_id in ids:
        caller.FreeBuffer(pb.FreeBufferRequest(buffer_id=buffer_id))
    assert usage(caller).memory_bytes == 0
    assert served[0].backend.memory_in_use() == before


@pytest.mark.parametrize("caller", ["sessions"], indirect=True)
def test_sessions_quota(caller: Caller) -> None:
    first = caller.load(SCAN)
    assert caller.load(SCAN) == first  # the same session again costs nothing
    refused_by("sessions", lambda: caller.load(SAXPY))
    assert usage(caller).sessions == 1
    caller.Release(pb.ReleaseRequest(session_id=first))  # one of its two loads
    refused_by("sessions", lambda: caller.load(SAXPY))
    caller.Release(pb.ReleaseRequest(session_id=first))
    caller.load(SAXPY)


@pytest.mark.parametrize("caller", ["buffers"], indirect=True)
def test_buffers_quota(caller: Caller) -> None:
    ids = [caller.buffer(64) for _ in range(2)]
    refused_by("buffers", lambda: caller.buffer(64))
    assert (usage(caller).buffers, usage(caller).memory_bytes) == (2, 128)
    caller.FreeBuffer(pb.FreeBufferRequest(buffer_id=ids[0]))
    caller.buffer(64)


@pytest.mark.parametrize("caller", [None], indirect=True)
def test_tokenless_clients_get_the_default_quotas(caller: Caller) -> None:
    for _ in range(3):
        caller.buffer(64)
    refused_by("buffers", lambda: caller.buffer(64))
    assert caller.status().tenant == "local"


@pytest.mark.parametrize("caller", ["launches"], indirect=True)
def test_launches_in_flight_quota(caller: Caller) -> None:
    n = 1 << 22
    session = caller.load(SCAN)
    x, y = caller.buffer(4 * n), caller.buffer(4 * n)
    caller.WriteBuffer(chunks(x, np.ones(n, np.float32).tobytes(), 1 << 20))
    scalars = {"n": pb.Scalar(u32=n)}
    caller.AllocateIntermediates(
        pb.AllocateIntermediatesRequest(session_id=session, runtime_scalars=scalars)
    )
    launch = pb.LaunchRequest(
        session_id=session, operands=[x], results=[y], runtime_scalars=scalars
    )
    error = None
    for _ in range(50):  # each scan of 4M elements takes milliseconds: one stays in flight
        try:
            caller.Launch(launch)
        except grpc.RpcError as refused:
            error = refused
            break
    assert error is not None, "no launch was refused"
    names_quota(error, "launches_in_flight")
    caller.WaitLaunch(pb.WaitLaunchRequest(session_id=session))
    assert usage(caller).launches_in_flight == 0
    reply = caller.Launch(
        pb.LaunchRequest(
            session_id=session, operands=[x], results=[y], runtime_scalars=scalars, wait=True
        )
    )
    assert reply.completed
    total = np.frombuffer(
        b"".join(c.data for c in caller.ReadBuffer(pb.ReadBufferRequest(buffer_id=y))), np.float32
    )
    assert total[-1] == n
