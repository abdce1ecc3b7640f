"""A small in-process LaunchService double: buffers in memory, one scan pipeline, rich errors.

It exists to test the client's wire behaviour (metadata, chunking, error
decoding, credentials, surviving a restart) without the real daemon; the
end-to-end tests use the real one. ``restart()`` acts out a daemon that came
back as a new instance, ``fault()`` one whose device was lost, ``fault_device()``
one that lost one device and lives on. Launches are unary calls; with
``rings`` it serves ``RingStream`` too (``tests.client.fake_ring``), so the
client pipelines them as ring records.
"""

from __future__ import annotations

import queue
import secrets
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
from google.rpc import code_pb2
from grpc_status import rpc_status

from accy.protocol.launch.v1 import launch_pb2 as pb
from accy.protocol.launch.v1 import launch_pb2_grpc
from tests.client.fake_ring import GONE, FakeRing, Refusal, refusal, serve_ring

SCAN = pb.PipelineInfo(
    target="accy.kernel.device_scan",
    version=1,
    description="inclusive prefix sum",
    operands=[pb.BufferInfo(name="x", dtype=pb.DTYPE_F32, extent="n")],
    results=[pb.BufferInfo(name="y", dtype=pb.DTYPE_F32, extent="n")],
    runtime_scalars=[
        pb.ScalarInfo(name="n", dtype=pb.DTYPE_U32, has_min=True, min=1, has_max=True, max=2**30)
    ],
    stage_count=1,
    formats=["host_py"],
)


Refused = Refusal
"""A refusal, as the google.rpc.Status to abort a call with (or answer a ring record)."""


def abort(
    context: grpc.ServicerContext, code: int, message: str, reason: str, **extra: str
) -> None:
    """Abort with a google.rpc.Status carrying ErrorInfo and, for ``field``, a BadRequest."""
    context.abort_with_status(rpc_status.to_status(refusal(code, message, reason, **extra)))


def refuse(
    context: grpc.ServicerContext, code: int, message: str, reason: str, **extra: str
) -> None:
    """Raise ``Refused`` with the status ``abort`` would end the call with."""
    raise Refused(refusal(code, message, reason, **extra))


@dataclass
class FakeState:
    """What the double remembers, for assertions."""

    clients: dict[str, str] = field(default_factory=dict)
    buffers: dict[str, tuple[str, bytearray]] = field(default_factory=dict)
    sessions: dict[str, str] = field(default_factory=dict)
    write_chunk_sizes: list[int] = field(default_factory=list)
    read_chunk_size: int = 0
    launches: list[pb.LaunchRequest] = field(default_factory=list)
    launch_ids: list[str] = field(default_factory=list)
    streams: int = 0
    """RingStream calls opened."""
    devices: dict[str, int] = field(default_factory=dict)
    """The device each session was loaded on."""
    scratch: list[pb.AllocateIntermediatesRequest] = field(default_factory=list)
    authorization: list[tuple[str, str]] = field(default_factory=list)
    """(method, authorization metadata) of every call, Attach included."""


TOKEN = "s3cret"
"""The token a double made with ``tokens=True`` accepts; ``READ_ONLY`` may not launch."""
READ_ONLY = "r3ad"


class FakeLaunchService(launch_pb2_grpc.LaunchServiceServicer):  # type: ignore[misc]
    """Enough of the service to exercise every client method."""

    def __init__(self, *, tokens: bool = False) -> None:
        self.state = FakeState()
        self.tokens = tokens
        self.instance_id = "i1"
        self.fault_session: str | None = None
        self.refuse_attach = False
        self.launch_delay = 0.0
        """Seconds each launch takes (to act out a slow daemon)."""
        self.answer_delay = 0.0
        """Seconds between a launch's work and its answer (an answer on its way)."""
        self.rings = False
        """Serve RingStream (else it is UNIMPLEMENTED, and launches are unary calls)."""
        self.doomed: dict[str, int] = {}
        """Sessions on a device lost on its own (``fault_device``), and that device."""
        self.port = 0
        self._attach_epoch = 0
        self._streams: list[queue.SimpleQueue[Any]] = []
        self._instances = 1

    def restart(self) -> None:
        """Come back as a new instance: every client, session and buffer forgotten.

        The old instance's RingStreams break (UNAVAILABLE), as when its process exits.
        """
        streams, self._streams = self._streams, []
        for answers in streams:
            answers.put(GONE)
        self._instances += 1
        self.state = FakeState()
        self.fault_session = None
        self.instance_id = f"i{self._instances}"

    def end_attach_streams(self) -> None:
        """End every open Attach stream (the daemon detaching its clients); nothing else."""
        self._attach_epoch += 1

    def fault(self, session: str) -> None:
        """Lose the device: every call fails UNAVAILABLE/DEVICE_LOST naming ``session``."""
        self.fault_session = session

    def fault_device(self, device: int) -> None:
        """Lose ``device`` alone, as a daemon with device workers does: the next launch of
        each session loaded there fails UNAVAILABLE/DEVICE_LOST scoped to the device (and
        that session is gone); the daemon, and sessions loaded again, go on."""
        self.doomed = {s: d for s, d in self.state.devices.items() if d == device}

    def _gate(
        self, context: grpc.ServicerContext, method: str, fail: Callable[..., None] = abort
    ) -> None:
        """What the real daemon checks before anything: the token, then the device."""
        metadata = dict(context.invocation_metadata())
        given = metadata.get("authorization", "")
        self.state.authorization.append((method, given))
        if self.tokens and given not in (f"Bearer {TOKEN}", f"Bearer {READ_ONLY}"):
            why = "no bearer token" if not given else "unknown bearer token"
            abort(context, code_pb2.UNAUTHENTICATED, why, "UNAUTHENTICATED")
        if self.tokens and method == "Launch" and given == f"Bearer {READ_ONLY}":
            fail(context, code_pb2.PERMISSION_DENIED, "no launch scope", "PERMISSION_DENIED")
        if self.fault_session is not None:
            fail(
                context,
                code_pb2.UNAVAILABLE,
                "the device was lost",
                "DEVICE_LOST",
                session=self.fault_session,
            )

    def _client(
        self, context: grpc.ServicerContext, method: str = "", fail: Callable[..., None] = abort
    ) -> str:
        self._gate(context, method, fail)
        ids = [v for k, v in context.invocation_metadata() if k == "accy-client-id"]
        if not ids or ids[0] not in self.state.clients:
            fail(
                context,
                code_pb2.NOT_FOUND,
                f"no attached client {ids[0] if ids else ''!r}",
                "CLIENT_UNKNOWN",
                field="client_id",
            )
        return str(ids[0])

    def _buffer(
        self, context: grpc.ServicerContext, buffer_id: str, fail: Callable[..., None] = abort
    ) -> bytearray:
        owner, data = self.state.buffers.get(buffer_id, ("", bytearray()))
        if owner != self._client(context, fail=fail):
            fail(
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
        self._gate(context, "Attach")
        if self.refuse_attach:
            context.abort(grpc.StatusCode.UNAVAILABLE, "not serving yet")
        client_id = secrets.token_hex(8)
        state, instance, epoch = self.state, self.instance_id, self._attach_epoch
        state.clients[client_id] = request.client_name
        context.add_callback(lambda: state.clients.pop(client_id, None))
        yield pb.AttachEvent(
            attached=pb.Attached(
                client_id=client_id,
                instance_id=instance,
                backend="fake",
                device_name="none",
                tenant="default",
            )
        )
        sequence = 0
        while (
            context.is_active()
            and (self.instance_id, self._attach_epoch) == (instance, epoch)
            and not self.fault_session
        ):
            time.sleep(0.02)
            sequence += 1
            yield pb.AttachEvent(heartbeat=pb.Heartbeat(sequence=sequence))

    def ListPipelines(
        self, request: pb.ListPipelinesRequest, context: grpc.ServicerContext
    ) -> pb.ListPipelinesResponse:
        self._gate(context, "ListPipelines")  # as the daemon: no client id needed
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
        device = request.device if request.HasField("device") else 0
        self.state.devices[session_id] = device
        return pb.LoadPipelineResponse(
            session_id=session_id, created=True, pipeline=SCAN, format="host_py", device=device
        )

    def AllocateIntermediates(
        self, request: pb.AllocateIntermediatesRequest, context: grpc.ServicerContext
    ) -> pb.AllocateIntermediatesResponse:
        self._client(context)
        if request.session_id not in self.state.sessions:
            abort(context, code_pb2.NOT_FOUND, "no such session", "NOT_FOUND", field="session_id")
        self.state.scratch.append(request)
        return pb.AllocateIntermediatesResponse(byte_size=256)

    def Launch(self, request: pb.LaunchRequest, context: grpc.ServicerContext) -> pb.LaunchResponse:
        return self._launch(request, context, abort)

    def RingStream(
        self, frames: Iterator[pb.RingFrame], context: grpc.ServicerContext
    ) -> Iterator[pb.RingState]:
        if not self.rings:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "this double serves no RingStream")
        self.state.streams += 1
        metadata = dict(context.invocation_metadata())
        if self.tokens and metadata.get("authorization") == f"Bearer {READ_ONLY}":
            abort(context, code_pb2.PERMISSION_DENIED, "no launch scope", "PERMISSION_DENIED")
        client = self._client(context)
        state = self.state

        def owns(role: str, object_id: str) -> bool:
            if role == "session":
                return state.sessions.get(object_id) == client
            return state.buffers.get(object_id, ("", b""))[0] == client

        ring = FakeRing(lambda request: self._launch(request, context, refuse), owns)
        yield from serve_ring(ring, frames, context, self._streams)

    def _launch(
        self, request: pb.LaunchRequest, context: grpc.ServicerContext, fail: Callable[..., None]
    ) -> pb.LaunchResponse:
        state = self.state  # the instance the request reached, even if it restarts meanwhile
        self._client(context, "Launch", fail)
        time.sleep(self.launch_delay)
        if request.session_id not in state.sessions:
            fail(context, code_pb2.NOT_FOUND, "no such session", "NOT_FOUND", field="session_id")
        device = self.doomed.pop(request.session_id, None)
        if device is not None:
            del state.sessions[request.session_id]  # replaced with its device
            fail(
                context,
                code_pb2.UNAVAILABLE,
                f"device {device} faulted in session {request.session_id}",
                "DEVICE_LOST",
                session=request.session_id,
                device=str(device),
                scope="device",
            )
        state.launches.append(request)
        n = request.runtime_scalars["n"].u32
        if n > SCAN.runtime_scalars[0].max:
            fail(
                context,
                code_pb2.INVALID_ARGUMENT,
                "n too large",
                "SCALAR_OUT_OF_BOUNDS",
                field="runtime_scalars[n]",
            )
        x = np.frombuffer(self._buffer(context, request.operands[0], fail), np.float32)[:n]
        y = self._buffer(context, request.results[0], fail)
        y[: 4 * n] = np.cumsum(x, dtype=np.float32).tobytes()
        launch_id = secrets.token_hex(4)
        state.launch_ids.append(launch_id)
        time.sleep(self.answer_delay)
        return pb.LaunchResponse(launch_id=launch_id, completed=request.wait)

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
        # A client id is optional, as the daemon's; one given must be attached (unlike the
        # daemon's: the tests here learn of a restart through a client's status call).
        named = any(k == "accy-client-id" for k, _ in context.invocation_metadata())
        client = self._client(context) if named else self._gate(context, "GetStatus")
        mine = [b for owner, b in self.state.buffers.values() if owner == client]
        return pb.GetStatusResponse(
            instance_id=self.instance_id,
            backend="fake",
            serving=True,
            clients=len(self.state.clients),
            buffers=len(self.state.buffers),
            my_buffers=len(mine),
            tenant="local",
            tenants=[
                pb.TenantStatus(
                    name="local",
                    clients=len(self.state.clients),
                    buffers=len(self.state.buffers),
                    quotas=pb.TenantQuotas(buffers=64),
                    quota_refusals={"buffers": 1},
                )
            ],
            quota_refusals=1,
            restarts=self._instances - 1,
        )


def serve(
    address: str,
    *,
    tokens: bool = False,
    credentials: grpc.ServerCredentials | None = None,
) -> tuple[grpc.Server, FakeLaunchService]:
    """Start the double on ``address`` (``unix:PATH`` or ``127.0.0.1:0``); returns it running.

    ``tokens`` makes it want a bearer token, ``credentials`` serve TLS.
    """
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    service = FakeLaunchService(tokens=tokens)
    launch_pb2_grpc.add_LaunchServiceServicer_to_server(service, server)
    if credentials is None:
        service.port = server.add_insecure_port(address)
    else:
        service.port = server.add_secure_port(address, credentials)
    server.start()
    return server, service


def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll ``check`` until it holds; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
