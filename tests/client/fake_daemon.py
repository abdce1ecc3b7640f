"""A small in-process LaunchService double: buffers in memory, one scan pipeline, rich errors.

It exists to test the client's wire behaviour (metadata, chunking, error
decoding) without the real daemon; the end-to-end tests use the real one.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field

import grpc
import numpy as np
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from accy.launch.v1 import launch_pb2 as pb
from accy.launch.v1 import launch_pb2_grpc

SCAN = pb.PipelineInfo(
    target="accy.kernel.device_scan",
    version=1,
    description="inclusive prefix sum",
    operands=[pb.BufferInfo(name="x", dtype=pb.DTYPE_F32, extent="n")],
    results=[pb.BufferInfo(name="y", dtype=pb.DTYPE_F32, extent="n")],
    runtime_scalars=[
        pb.ScalarInfo(name="n", dtype=pb.DTYPE_U32, has_min=True, min=1, has_max=True, max=2**30)
    ],
    stage_count=3,
    formats=["host_py"],
)


def abort(
    context: grpc.ServicerContext, code: int, message: str, reason: str, **extra: str
) -> None:
    """Abort with a google.rpc.Status carrying ErrorInfo and, for ``field``, a BadRequest."""
    details = []
    info = any_pb2.Any()
    metadata = {k: v for k, v in extra.items() if k != "field"}
    info.Pack(error_details_pb2.ErrorInfo(reason=reason, domain="accy.dev", metadata=metadata))
    details.append(info)
    if "field" in extra:
        bad = any_pb2.Any()
        bad.Pack(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(
                        field=extra["field"], description=message
                    )
                ]
            )
        )
        details.append(bad)
    context.abort_with_status(
        rpc_status.to_status(status_pb2.Status(code=code, message=message, details=details))
    )


@dataclass
class FakeState:
    """What the double remembers, for assertions."""

    clients: dict[str, str] = field(default_factory=dict)
    buffers: dict[str, tuple[str, bytearray]] = field(default_factory=dict)
    sessions: dict[str, str] = field(default_factory=dict)
    write_chunk_sizes: list[int] = field(default_factory=list)
    read_chunk_size: int = 0
    launches: list[pb.LaunchRequest] = field(default_factory=list)


class FakeLaunchService(launch_pb2_grpc.LaunchServiceServicer):  # type: ignore[misc]
    """Enough of the service to exercise every client method."""

    def __init__(self) -> None:
        self.state = FakeState()
        self._lock = threading.Lock()

    def _client(self, context: grpc.ServicerContext) -> str:
        ids = [v for k, v in context.invocation_metadata() if k == "accy-client-id"]
        if not ids or ids[0] not in self.state.clients:
            abort(context, code_pb2.UNAUTHENTICATED, "attach first", "NOT_ATTACHED")
        return str(ids[0])

    def _buffer(self, context: grpc.ServicerContext, buffer_id: str) -> bytearray:
        owner, data = self.state.buffers.get(buffer_id, ("", bytearray()))
        if owner != self._client(context):
            abort(
                context,
                code_pb2.NOT_FOUND,
                f"no buffer {buffer_id}",
                "NOT_FOUND",
                field="buffer_id",
            )
        return data

    def Attach(
        self, request: pb.AttachRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.AttachEvent]:
        client_id = secrets.token_hex(8)
        self.state.clients[client_id] = request.client_name
        context.add_callback(lambda: self.state.clients.pop(client_id, None))
        yield pb.AttachEvent(
            attached=pb.Attached(
                client_id=client_id, instance_id="i1", backend="fake", device_name="none"
            )
        )
        sequence = 0
        while context.is_active():
            time.sleep(0.05)
            sequence += 1
            yield pb.AttachEvent(heartbeat=pb.Heartbeat(sequence=sequence))

    def ListPipelines(
        self, request: pb.ListPipelinesRequest, context: grpc.ServicerContext
    ) -> pb.ListPipelinesResponse:
        self._client(context)
        return pb.ListPipelinesResponse(pipelines=[SCAN], backend_formats=["host_py"])

    def LoadPipeline(
        self, request: pb.LoadPipelineRequest, context: grpc.ServicerContext
    ) -> pb.LoadPipelineResponse:
        client = self._client(context)
        if request.target != SCAN.target:
            abort(
                context,
                code_pb2.NOT_FOUND,
                "no such pipeline",
                "PIPELINE_NOT_FOUND",
                field="target",
            )
        session_id = secrets.token_hex(8)
        self.state.sessions[session_id] = client
        return pb.LoadPipelineResponse(
            session_id=session_id, created=True, pipeline=SCAN, format="host_py"
        )

    def AllocateIntermediates(
        self, request: pb.AllocateIntermediatesRequest, context: grpc.ServicerContext
    ) -> pb.AllocateIntermediatesResponse:
        self._client(context)
        return pb.AllocateIntermediatesResponse(byte_size=256)

    def Launch(self, request: pb.LaunchRequest, context: grpc.ServicerContext) -> pb.LaunchResponse:
        self._client(context)
        self.state.launches.append(request)
        n = request.runtime_scalars["n"].u32
        if n > SCAN.runtime_scalars[0].max:
            abort(
                context,
                code_pb2.INVALID_ARGUMENT,
                "n too large",
                "SCALAR_OUT_OF_BOUNDS",
                field="runtime_scalars[n]",
            )
        x = np.frombuffer(self._buffer(context, request.operands[0]), np.float32)[:n]
        y = self._buffer(context, request.results[0])
        y[: 4 * n] = np.cumsum(x, dtype=np.float32).tobytes()
        return pb.LaunchResponse(launch_id=secrets.token_hex(4), completed=request.wait)

    def WaitLaunch(
        self, request: pb.WaitLaunchRequest, context: grpc.ServicerContext
    ) -> pb.WaitLaunchResponse:
        self._client(context)
        return pb.WaitLaunchResponse()

    def Release(
        self, request: pb.ReleaseRequest, context: grpc.ServicerContext
    ) -> pb.ReleaseResponse:
        self._client(context)
        if self.state.sessions.pop(request.session_id, None) is None:
            abort(context, code_pb2.NOT_FOUND, "no such session", "NOT_FOUND", field="session_id")
        return pb.ReleaseResponse()

    def AllocateBuffer(
        self, request: pb.AllocateBufferRequest, context: grpc.ServicerContext
    ) -> pb.AllocateBufferResponse:
        client = self._client(context)
        if request.byte_size > 1 << 30:
            abort(
                context,
                code_pb2.RESOURCE_EXHAUSTED,
                "over quota",
                "QUOTA_EXCEEDED",
                quota="device_memory",
            )
        buffer_id = secrets.token_hex(8)
        self.state.buffers[buffer_id] = (client, bytearray(request.byte_size))
        return pb.AllocateBufferResponse(buffer_id=buffer_id, byte_size=request.byte_size)

    def WriteBuffer(
        self, request_iterator: Iterator[pb.WriteBufferChunk], context: grpc.ServicerContext
    ) -> pb.WriteBufferResponse:
        data = None
        written = 0
        for chunk in request_iterator:
            if data is None:
                data = self._buffer(context, chunk.buffer_id)
            self.state.write_chunk_sizes.append(len(chunk.data))
            data[chunk.offset : chunk.offset + len(chunk.data)] = chunk.data
            written += len(chunk.data)
        return pb.WriteBufferResponse(bytes_written=written)

    def ReadBuffer(
        self, request: pb.ReadBufferRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.ReadBufferChunk]:
        data = self._buffer(context, request.buffer_id)
        self.state.read_chunk_size = request.chunk_size
        end = request.offset + (request.size or len(data) - request.offset)
        starts = list(range(request.offset, end, request.chunk_size))
        for start in reversed(starts):  # out of order on purpose: the client places by offset
            yield pb.ReadBufferChunk(
                offset=start, data=bytes(data[start : min(end, start + request.chunk_size)])
            )

    def FreeBuffer(
        self, request: pb.FreeBufferRequest, context: grpc.ServicerContext
    ) -> pb.FreeBufferResponse:
        self._buffer(context, request.buffer_id)
        del self.state.buffers[request.buffer_id]
        return pb.FreeBufferResponse()

    def Run(self, request: pb.RunRequest, context: grpc.ServicerContext) -> pb.RunResponse:
        self._client(context)
        x = np.frombuffer(request.operands[0].data, np.float32)
        y = np.cumsum(x, dtype=np.float32)
        return pb.RunResponse(results=[pb.Tensor(name="y", dtype=pb.DTYPE_F32, data=y.tobytes())])

    def GetStatus(
        self, request: pb.GetStatusRequest, context: grpc.ServicerContext
    ) -> pb.GetStatusResponse:
        client = self._client(context)
        mine = [b for owner, b in self.state.buffers.values() if owner == client]
        return pb.GetStatusResponse(
            instance_id="i1",
            backend="fake",
            serving=True,
            clients=len(self.state.clients),
            buffers=len(self.state.buffers),
            my_buffers=len(mine),
        )


def serve(address: str) -> tuple[grpc.Server, FakeLaunchService]:
    """Start the double on ``address`` (``unix:PATH`` or ``127.0.0.1:0``); returns it running."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    service = FakeLaunchService()
    launch_pb2_grpc.add_LaunchServiceServicer_to_server(service, server)
    server.add_insecure_port(address)
    server.start()
    return server, service
