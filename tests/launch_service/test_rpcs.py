"""Every RPC through a real server on a Unix socket and on TCP loopback, checked against numpy."""

from __future__ import annotations

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import (  # type: ignore[import-untyped, unused-ignore]
    reflection_pb2,
    reflection_pb2_grpc,
)

from accy.protocol.launch.v1 import launch_pb2 as pb
from tests.launch_service.harness import Attached, ServerThread, chunks

N = 70000
RNG = np.random.default_rng(7)


def upload(client: Attached, data: np.ndarray, chunk: int = 65536) -> str:
    buffer_id = client.AllocateBuffer(
        pb.AllocateBufferRequest(byte_size=data.nbytes, dtype=pb.DTYPE_F32)
    ).buffer_id
    written = client.WriteBuffer(chunks(buffer_id, data.tobytes(), chunk))
    assert written.bytes_written == data.nbytes
    return buffer_id


def download(client: Attached, buffer_id: str, chunk_size: int = 0) -> np.ndarray:
    pieces = list(
        client.ReadBuffer(pb.ReadBufferRequest(buffer_id=buffer_id, chunk_size=chunk_size))
    )
    assert [p.offset for p in pieces] == sorted(p.offset for p in pieces)
    return np.frombuffer(b"".join(p.data for p in pieces), np.float32)


def test_list_pipelines_describes_the_builtin_catalog(client: Attached) -> None:
    answer = client.stub.ListPipelines(pb.ListPipelinesRequest())
    assert list(answer.backend_formats) == ["host_py"]
    scan = {p.target: p for p in answer.pipelines}["accy.kernel.device_scan"]
    first = scan.intermediates[0]
    assert (first.name, first.extent) == ("state", "ceil_div(n, 8192) + 1")
    assert first.dtype == pb.DTYPE_U64
    assert scan.operands[0].dtype == pb.DTYPE_F32 and scan.stage_count == 1
    assert scan.runtime_scalars[0].has_max and scan.runtime_scalars[0].max == 2**30
    assert "host_py" in scan.formats


def test_attach_sends_heartbeats(client: Attached) -> None:
    event = next(client.stream)
    assert event.heartbeat.sequence == 1


def test_scan_round_trip_in_chunks_with_and_without_waiting(client: Attached) -> None:
    loaded = client.LoadPipeline(pb.LoadPipelineRequest(target="accy.kernel.device_scan"))
    assert loaded.created and loaded.format == "host_py"
    assert not client.LoadPipeline(pb.LoadPipelineRequest(target="accy.kernel.device_scan")).created
    x = RNG.random(N, dtype=np.float32)
    bx, by = upload(client, x), upload(client, np.zeros(N, np.float32))
    n = {"n": pb.Scalar(u32=N)}
    waited = client.Launch(
        pb.LaunchRequest(
            session_id=loaded.session_id, operands=[bx], results=[by], runtime_scalars=n
        )
    )
    assert waited.completed and waited.launch_id.startswith("lau_")  # no scratch: waited anyway
    np.testing.assert_allclose(download(client, by, 50000), np.cumsum(x), rtol=1e-4)
    scratch = client.AllocateIntermediates(
        pb.AllocateIntermediatesRequest(session_id=loaded.session_id, runtime_scalars=n)
    )
    assert scratch.byte_size == 8 * (9 + 1) + 4 * 2 * 9  # state and partials of 9 tiles of 8192
    queued = client.Launch(
        pb.LaunchRequest(
            session_id=loaded.session_id, operands=[by], results=[bx], runtime_scalars=n
        )
    )
    assert not queued.completed
    client.WaitLaunch(
        pb.WaitLaunchRequest(session_id=loaded.session_id, launch_id=queued.launch_id)
    )
    client.WaitLaunch(pb.WaitLaunchRequest(session_id=loaded.session_id))
    np.testing.assert_allclose(download(client, bx), np.cumsum(np.cumsum(x)), rtol=1e-3)
    client.Release(pb.ReleaseRequest(session_id=loaded.session_id))  # loaded twice above:
    assert client.GetStatus(pb.GetStatusRequest()).my_sessions == 1  # one load is left
    client.Release(pb.ReleaseRequest(session_id=loaded.session_id))
    for buffer_id in (bx, by):
        client.FreeBuffer(pb.FreeBufferRequest(buffer_id=buffer_id))
    status = client.GetStatus(pb.GetStatusRequest())
    assert (status.my_sessions, status.my_buffers, status.my_memory_in_use) == (0, 0, 0)


def test_a_buffer_larger_than_one_message(client: Attached) -> None:
    data = RNG.random((6 << 20) // 4, dtype=np.float32)  # 6 MiB, past the 4 MiB default limit
    buffer_id = upload(client, data, chunk=1 << 20)
    np.testing.assert_array_equal(download(client, buffer_id), data)
    part = client.ReadBuffer(pb.ReadBufferRequest(buffer_id=buffer_id, offset=8, size=8))
    assert np.frombuffer(b"".join(c.data for c in part), np.float32).tolist() == data[2:4].tolist()


def test_launches_of_one_session_apply_in_arrival_order(client: Attached) -> None:
    session = client.LoadPipeline(pb.LoadPipelineRequest(target="accy.kernel.saxpy")).session_id
    x, y = RNG.random(N, dtype=np.float32), RNG.random(N, dtype=np.float32)
    bx, by = upload(client, x), upload(client, y)
    expected = y.copy()
    for step in range(8):
        a = np.float32(0.25 * (step + 1))
        operands = [by, by] if step % 2 else [bx, by]
        expected = a * (expected if step % 2 else x) + expected
        client.Launch(
            pb.LaunchRequest(
                session_id=session,
                operands=operands,
                results=[by],
                runtime_scalars={"n": pb.Scalar(u32=N), "a": pb.Scalar(f32=float(a))},
            )
        )
    np.testing.assert_allclose(download(client, by), expected, rtol=1e-5)


def test_run_in_one_call_with_and_without_attaching(client: Attached) -> None:
    x, y = RNG.random(1000, dtype=np.float32), RNG.random(1000, dtype=np.float32)
    request = pb.RunRequest(
        target="accy.kernel.saxpy",
        operands=[
            pb.Tensor(name="x", dtype=pb.DTYPE_F32, data=x.tobytes()),
            pb.Tensor(data=y.tobytes()),
        ],
        runtime_scalars={"n": pb.Scalar(u32=1000), "a": pb.Scalar(f32=3.0)},
    )
    for answer in (client.Run(request), client.stub.Run(request)):
        [out] = answer.results
        assert out.name == "out" and out.dtype == pb.DTYPE_F32
        np.testing.assert_allclose(np.frombuffer(out.data, np.float32), 3 * x + y, rtol=1e-6)


def test_health_and_reflection(channel: grpc.Channel, server: ServerThread) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "accy.launch.v1.LaunchService"):
        answer = health.Check(health_pb2.HealthCheckRequest(service=service))
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
    [answer] = reflect.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    )
    names = {s.name for s in answer.list_services_response.service}
    assert {"accy.launch.v1.LaunchService", "grpc.health.v1.Health"} <= names
