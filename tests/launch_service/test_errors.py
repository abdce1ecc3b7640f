"""Refusals: status codes, google.rpc details naming the field, and other clients' ids."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from accy.protocol.launch.v1 import launch_pb2 as pb
from accy.protocol.launch.v1 import launch_pb2_grpc
from accyd.core.tenants import Quotas
from tests.launch_service.harness import (
    Attached,
    ServerThread,
    attach,
    chunks,
    details,
    field_of,
    make_config,
    rpc_error,
)

INVALID = grpc.StatusCode.INVALID_ARGUMENT
SCAN = "accy.kernel.device_scan"


def session_and_buffers(client: Attached, n: int = 100) -> tuple[str, str, str]:
    session = client.LoadPipeline(pb.LoadPipelineRequest(target=SCAN)).session_id
    x, y = (
        client.AllocateBuffer(
            pb.AllocateBufferRequest(byte_size=4 * n, dtype=pb.DTYPE_F32)
        ).buffer_id
        for _ in range(2)
    )
    return session, x, y


def launch(
    session: str, operands: list[str], results: list[str], **scalars: Any
) -> pb.LaunchRequest:
    return pb.LaunchRequest(
        session_id=session,
        operands=operands,
        results=results,
        runtime_scalars={name: pb.Scalar(**value) for name, value in scalars.items()},
        wait=True,
    )


def test_bad_fields_are_invalid_argument_naming_the_field(client: Attached) -> None:
    session, x, y = session_and_buffers(client)
    cases: list[tuple[Callable[[], Any], str]] = [
        (lambda: client.Launch(launch(session, [x], [y])), "runtime_scalars.n"),
        (lambda: client.Launch(launch(session, [x], [y], n={"u32": 0})), "runtime_scalars.n"),
        (lambda: client.Launch(launch(session, [x], [y], n={"u32": 101})), "operands[0]"),
        (
            lambda: client.Launch(launch(session, [x], [y], n={"u32": 1}, m={"u32": 1})),
            "runtime_scalars.m",
        ),
        (lambda: client.Launch(launch(session, [x, y], [y], n={"u32": 1})), "operands"),
        (lambda: client.Launch(launch(session, [x], [y], n={"f32": 1.0})), "runtime_scalars.n"),
        (lambda: client.Launch(launch(session, [x], [y], n={})), "runtime_scalars.n"),
        (lambda: client.Launch(launch("", [x], [y], n={"u32": 1})), "session_id"),
        (lambda: client.AllocateBuffer(pb.AllocateBufferRequest(byte_size=0)), "byte_size"),
        (
            lambda: client.AllocateBuffer(
                pb.AllocateBufferRequest(byte_size=6, dtype=pb.DTYPE_F32)
            ),
            "byte_size",
        ),
        (lambda: client.AllocateBuffer(pb.AllocateBufferRequest(byte_size=8, dtype=99)), "dtype"),
        (lambda: client.LoadPipeline(pb.LoadPipelineRequest(target=SCAN, format="zig")), "format"),
        (
            lambda: client.LoadPipeline(pb.LoadPipelineRequest(target=SCAN, format="cuda_cpp")),
            "format",
        ),
        (lambda: client.LoadPipeline(pb.LoadPipelineRequest(target="x" * 1000)), "target"),
        (lambda: list(client.ReadBuffer(pb.ReadBufferRequest(buffer_id=x, offset=401))), "offset"),
        (lambda: list(client.ReadBuffer(pb.ReadBufferRequest(buffer_id=x, size=401))), "size"),
        (lambda: client.WriteBuffer(chunks(x, bytes(404), 404)), "offset"),
        (lambda: client.WriteBuffer(iter([])), "buffer_id"),
        (lambda: client.stub.LoadPipeline(pb.LoadPipelineRequest(target=SCAN)), "accy-client-id"),
    ]
    for call, field in cases:
        error = rpc_error(call)
        assert (error.code(), field_of(error)) == (INVALID, field), error.details()
        info = details(error)["ErrorInfo"]
        assert info.domain == "accy.dev" and info.reason and info.metadata["request_id"]


def test_scratch_too_small_is_failed_precondition(client: Attached) -> None:
    session, x, y = session_and_buffers(client, 20000)  # 3 of device_scan's tiles
    client.AllocateIntermediates(
        pb.AllocateIntermediatesRequest(
            session_id=session, runtime_scalars={"n": pb.Scalar(u32=10)}
        )
    )
    error = rpc_error(lambda: client.Launch(launch(session, [x], [y], n={"u32": 20000})))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "AllocateIntermediates" in (error.details() or "")


def test_other_clients_ids_are_not_found_like_unknown_ones(
    client: Attached, channel: grpc.Channel
) -> None:
    session, x, y = session_and_buffers(client)
    launched = client.Launch(launch(session, [x], [y], n={"u32": 100}))
    other = attach(channel, "other")
    try:
        calls: list[Callable[[str], Any]] = [
            lambda s: other.Launch(launch(s, [], [], n={"u32": 1})),
            lambda s: other.Release(pb.ReleaseRequest(session_id=s)),
            lambda s: other.WaitLaunch(
                pb.WaitLaunchRequest(session_id=s, launch_id=launched.launch_id)
            ),
            lambda s: other.AllocateIntermediates(pb.AllocateIntermediatesRequest(session_id=s)),
        ]
        for call in calls:
            foreign = rpc_error(functools.partial(call, session))
            unknown = rpc_error(functools.partial(call, "ses_nope"))
            assert foreign.code() == unknown.code() == grpc.StatusCode.NOT_FOUND
            assert field_of(foreign) == field_of(unknown) == "session_id"
        for buffer_call in (
            lambda b: other.FreeBuffer(pb.FreeBufferRequest(buffer_id=b)),
            lambda b: list(other.ReadBuffer(pb.ReadBufferRequest(buffer_id=b))),
            lambda b: other.WriteBuffer(chunks(b, bytes(4), 4)),
        ):
            assert rpc_error(functools.partial(buffer_call, x)).code() == grpc.StatusCode.NOT_FOUND
        own = other.LoadPipeline(pb.LoadPipelineRequest(target=SCAN)).session_id
        error = rpc_error(lambda: other.Launch(launch(own, [x], [y], n={"u32": 1})))
        assert (error.code(), field_of(error)) == (grpc.StatusCode.NOT_FOUND, "operands[0]")
        assert other.GetStatus(pb.GetStatusRequest()).my_buffers == 0
    finally:
        other.detach()


def test_unknown_client_id_and_pipeline_are_not_found(channel: grpc.Channel) -> None:
    stub = launch_pb2_grpc.LaunchServiceStub(channel)
    error = rpc_error(
        lambda: stub.LoadPipeline(
            pb.LoadPipelineRequest(target=SCAN), metadata=(("accy-client-id", "cli_forged"),)
        )
    )
    assert error.code() == grpc.StatusCode.NOT_FOUND
    error = rpc_error(lambda: stub.Run(pb.RunRequest(target="no.such.pipeline")))
    assert (error.code(), field_of(error)) == (grpc.StatusCode.NOT_FOUND, "target")


@pytest.fixture(scope="module")
def quota_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = Path(tmp_path_factory.mktemp("quota"))
    running = ServerThread(make_config(folder, "unix", quotas=Quotas(buffers=1, memory_bytes=4096)))
    yield running
    running.stop()


def test_quota_refusal_is_resource_exhausted_with_quota_failure(quota_server: ServerThread) -> None:
    with grpc.insecure_channel(quota_server.address) as channel:
        client = attach(channel)
        client.AllocateBuffer(pb.AllocateBufferRequest(byte_size=16))
        error = rpc_error(lambda: client.AllocateBuffer(pb.AllocateBufferRequest(byte_size=16)))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        found = details(error)
        assert found["QuotaFailure"].violations[0].subject == "buffers"
        assert found["ErrorInfo"].reason == "QUOTA_EXCEEDED"
        assert found["ErrorInfo"].metadata["quota"] == "buffers"
        assert client.GetStatus(pb.GetStatusRequest()).my_buffers == 1
        client.detach()
