"""The launch service on grpc.aio: every RPC of ``accy.launch.v1.LaunchService``.

Handlers check the request's fields, convert them to domain values and call the core
facade (``Daemon``). Waits for the device (WaitLaunch, Release, FreeBuffer, detach) are
awaited on the event loop and hold no thread; other blocking work runs on the device-work
threads, within the caller's share. Buffer data moves in chunks, so no message size limit
bounds a buffer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import structlog

from accy.protocol.launch.v1 import launch_pb2 as pb
from accy.protocol.launch.v1 import launch_pb2_grpc
from accyd.backends.base import ExportKind
from accyd.core.clients import Client
from accyd.core.interface import Core
from accyd.core.tenants import Quotas
from accyd.doors.grpc import convert
from accyd.doors.grpc.admission import current_principal
from accyd.doors.grpc.auth import ADMIN_SCOPE, default_principal
from accyd.doors.grpc.calls import MAX_ID_LENGTH, Call, CallTracker, streaming, text_field, unary
from accyd.doors.grpc.encoded import EncodedAnswers, encode_read_chunk
from accyd.doors.grpc.ending import StreamEnds, until_ended
from accyd.doors.grpc.launches import Launcher
from accyd.doors.grpc.ring_stream import RingStreams
from accyd.doors.grpc.tasks import TaskSet
from accyd.doors.hostmem import Segments
from accyd.errors import FailedPrecondition, InvalidRequest
from accyd.logs import bind
from accyd.process.exits import Lineage
from accyd.ring import RingDoor
from accyd.ring.charges import stream_ring_usage
from accyd.ring.door import MAX_SLOTS
from accyd.ring.stream import StreamRings
from accyd.telemetry.metrics import Metrics, RingLaunchCounts
from accyd.tokens import Principal

__all__ = ["SERVICE_NAME", "LaunchServicer"]

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["LaunchService"].full_name

log = structlog.get_logger("accyd.doors.grpc")

_DIRECTIONS = {pb.COPY_DIRECTION_TO_BUFFER: True, pb.COPY_DIRECTION_TO_SEGMENT: False}
_EXPORT_KINDS = {
    ExportKind.CUDA_VMM: pb.EXPORT_KIND_CUDA_VMM,
    ExportKind.HOST_MEMFD: pb.EXPORT_KIND_HOST_MEMFD,
}


def _need_local(call: Call, what: str, field: str) -> None:
    """Refuse to share memory with a caller that cannot take it: the descriptors go over the
    Unix socket's handoff, so a call that came over TCP never could (it would only hold the
    daemon's memory and descriptors until the offer expired)."""
    peer = call.peer
    if not peer.startswith("unix:"):
        raise FailedPrecondition(
            f"this call came over TCP ({peer or 'an unknown peer'}): the daemon shares a {what} "
            "only with clients on its Unix socket; write and read buffers over gRPC instead",
            field=field,
        )


class LaunchServicer:
    """The RPCs of the launch service over one ``Daemon``."""

    def __init__(
        self,
        daemon: Core,
        calls: CallTracker,
        *,
        segments: Segments,
        tenant: str,
        heartbeat_seconds: float,
        read_chunk_bytes: int,
        max_chunk_bytes: int,
        launch_spin_seconds: float = 0.0,
        quotas: Quotas | None = None,
        metrics: Metrics | None = None,
        lineage: Lineage | None = None,
        rings: RingDoor | None = None,
        ring_streams: StreamRings | None = None,
        ring_counts: RingLaunchCounts | None = None,
    ) -> None:
        """``segments``: the shared memory it offers (none without a Unix socket); ``rings``:
        the same-host ring door, beside the Unix socket; ``ring_streams``: the rings over a
        stream (neither with ``--no-rings``)."""
        self.daemon = daemon
        self.rings = rings
        self.segments = segments
        self.calls = calls
        self.metrics = metrics or Metrics()  # Launch and WaitLaunch report to observe_launch
        self._default_principal = default_principal(tenant, quotas or Quotas())
        self._lineage = lineage or Lineage()
        self._heartbeat = heartbeat_seconds
        self._read_chunk = read_chunk_bytes
        self._max_chunk = max_chunk_bytes
        self._closing = asyncio.Event()
        self._detaching = TaskSet()
        self._watching = TaskSet()
        self._serving = TaskSet()  # RingStreams served: cleaned up even if their call is cancelled
        self._stream_ends = StreamEnds()  # each client's RingStreams end at its detach
        self._launcher = Launcher(
            daemon, calls.work, self.metrics, spin_seconds=launch_spin_seconds
        )
        # Counts the rings' launches (both kinds) in accy_launches.
        self.ring_counts = ring_counts or RingLaunchCounts(self.metrics, daemon.pipeline_of)
        self._ring_streams = None if ring_streams is None else RingStreams(ring_streams)

    def register(self, server: grpc.aio.Server) -> None:
        """Add the service's handlers to ``server`` (its interceptor admits their callers first)."""
        encoded = EncodedAnswers(server, ["ReadBuffer"])
        launch_pb2_grpc.add_LaunchServiceServicer_to_server(self, encoded)  # type: ignore[no-untyped-call, unused-ignore]

    # Attach -------------------------------------------------------------------

    @streaming
    async def Attach(self, request: pb.AttachRequest, call: Call) -> AsyncIterator[pb.AttachEvent]:
        name = request.client_name[:MAX_ID_LENGTH]
        principal = self._principal()
        client = self.daemon.attach(name, principal.tenant, principal.quotas)
        bind(client_id=client.id)
        # Liveness is watched beside this stream, not in it: a yield here waits while the
        # client's connection is full (a frozen reader), and must not hold up its detach.
        watch = self._watching.start(self._watch(client, float(request.liveness_seconds)))
        try:
            yield pb.AttachEvent(
                attached=pb.Attached(
                    client_id=client.id,
                    instance_id=self.daemon.instance_id,
                    backend=self.daemon.backend.kind.value,
                    device_name=self.daemon.backend.device_name,
                    tenant=client.tenant.name,
                )
            )
            sequence = 0
            while not (await asyncio.wait({watch}, timeout=self._heartbeat))[0]:
                sequence += 1
                yield pb.AttachEvent(heartbeat=pb.Heartbeat(sequence=sequence))
        finally:
            watch.cancel()
            self._detach_later(client.id)

    async def _watch(self, client: Client, liveness: float) -> None:
        """Detach ``client`` once it is silent past ``liveness`` seconds (0: never) or we close."""
        # Check a silent client a few times per liveness period.
        period = min(self._heartbeat, liveness / 4) if liveness else self._heartbeat
        while not self._closing.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), period)
                break
            if liveness and client.silent_for() > liveness:
                # Hung, or cut off without its connection closing: free what it holds.
                log.warning("client silent; detaching", silent_seconds=liveness)
                break
        self._detach_later(client.id)

    def _detach_later(self, client_id: str) -> None:
        self._detaching.start(self._detach(client_id))  # in the background: it may be cancelled

    async def _detach(self, client_id: str) -> None:
        self._stream_ends.end(client_id)  # its idle RingStreams end, as if it stopped sending
        try:  # its rings, segments and exports first (the daemon's extensions), then the rest
            await self.daemon.detach_async(client_id)
        except Exception:
            log.exception("detach failed", client_id=client_id)

    def close_attach_streams(self) -> None:
        self._closing.set()  # every Attach stream ends (each detaches its client)

    async def wait_detached(self) -> None:
        """After ``close_attach_streams``: return once every client's detach is done."""
        await self._watching.settle()  # each watch ends by starting its client's detach
        await self._detaching.settle()

    @unary
    async def Ping(self, request: pb.PingRequest, call: Call) -> pb.PingResponse:
        self.daemon.client(call.need_client())  # finding the client marks it seen
        return pb.PingResponse()

    # Catalog ------------------------------------------------------------------

    @unary
    async def ListPipelines(
        self, request: pb.ListPipelinesRequest, call: Call
    ) -> pb.ListPipelinesResponse:
        return pb.ListPipelinesResponse(
            pipelines=[
                convert.pipeline_info(p, self.daemon.formats_of(p)) for p in self.daemon.pipelines()
            ],
            backend_formats=[f.value for f in self.daemon.backend_formats()],
        )

    # Sessions -----------------------------------------------------------------

    @unary
    async def LoadPipeline(
        self, request: pb.LoadPipelineRequest, call: Call
    ) -> pb.LoadPipelineResponse:
        client_id = call.need_client()
        target = text_field(request.target, "target")
        fmt = convert.format_from_proto(text_field(request.format, "format", required=False))
        loaded = await self.calls.work.run_for(
            client_id,
            self.daemon.load_pipeline,
            client_id,
            target,
            request.version,
            fmt,
            request.device if request.HasField("device") else None,
        )
        bind(session_id=loaded.session_id)
        return pb.LoadPipelineResponse(
            session_id=loaded.session_id,
            created=loaded.created,
            pipeline=convert.pipeline_info(
                loaded.pipeline, self.daemon.formats_of(loaded.pipeline)
            ),
            format=loaded.format.value,
            device=loaded.device,
        )

    @unary
    async def AllocateIntermediates(
        self, request: pb.AllocateIntermediatesRequest, call: Call
    ) -> pb.AllocateIntermediatesResponse:
        client_id = call.need_client()
        session_id = self._session_id(request.session_id)
        scalars = convert.scalars_from_proto(request.runtime_scalars)
        size = await self.calls.work.run_for(
            client_id, self.daemon.allocate_intermediates, client_id, session_id, scalars
        )
        return pb.AllocateIntermediatesResponse(byte_size=size)

    @unary
    async def Launch(self, request: pb.LaunchRequest, call: Call) -> pb.LaunchResponse:
        client_id = call.need_client()
        pending = await self._launcher.submit(client_id, request, call.started)
        return await self._launcher.finish(client_id, pending)

    @unary
    async def WaitLaunch(self, request: pb.WaitLaunchRequest, call: Call) -> pb.WaitLaunchResponse:
        client_id = call.need_client()
        session_id = self._session_id(request.session_id)
        launch_id = text_field(request.launch_id, "launch_id", required=False) or None
        await self.daemon.wait_launch_async(client_id, session_id, launch_id)
        return pb.WaitLaunchResponse()

    @unary
    async def Release(self, request: pb.ReleaseRequest, call: Call) -> pb.ReleaseResponse:
        client_id = call.need_client()
        session_id = self._session_id(request.session_id)
        await self.daemon.release_async(client_id, session_id)
        return pb.ReleaseResponse()

    @staticmethod
    def _session_id(value: str) -> str:
        session_id = text_field(value, "session_id")
        bind(session_id=session_id)
        return session_id

    # Buffers ------------------------------------------------------------------

    @unary
    async def AllocateBuffer(
        self, request: pb.AllocateBufferRequest, call: Call
    ) -> pb.AllocateBufferResponse:
        client_id = call.need_client()
        dtype = convert.dtype_from_proto(request.dtype, "dtype")
        record = await self.calls.work.run_for(
            client_id,
            self.daemon.allocate_buffer,
            client_id,
            request.byte_size,
            dtype,
            request.device if request.HasField("device") else None,
            exportable=request.exportable,
        )
        return pb.AllocateBufferResponse(
            buffer_id=record.id, byte_size=record.byte_size, device=record.device
        )

    @unary
    async def WriteBuffer(
        self, request: AsyncIterator[pb.WriteBufferChunk], call: Call
    ) -> pb.WriteBufferResponse:
        client_id = call.need_client()
        transfer = None
        writing: asyncio.Future[None] | None = None  # the chunk before: copied in meanwhile
        try:
            async for chunk in request:
                if transfer is None:
                    buffer_id = text_field(chunk.buffer_id, "buffer_id")
                    bind(buffer_id=buffer_id)
                    transfer = self.daemon.open_write(client_id, buffer_id)
                    # The buffer's earlier work is awaited here: no thread waits for it.
                    await transfer.settled()
                elif chunk.buffer_id and chunk.buffer_id != transfer.record.id:
                    raise InvalidRequest(
                        "every chunk of a write names the same buffer (or none)", field="buffer_id"
                    )
                if writing is not None:
                    await writing
                    writing = None
                if chunk.data:
                    # Copied in on a device-work thread while the next chunk arrives.
                    writing = asyncio.ensure_future(
                        self.calls.work.run_for(client_id, transfer.write, chunk.offset, chunk.data)
                    )
            if writing is not None:
                await writing
                writing = None
        finally:
            if writing is not None:
                # Failed or cancelled mid-write: the copy in flight ends before the finish.
                await asyncio.gather(writing, return_exceptions=True)
            if transfer is not None:
                transfer.finish()
        if transfer is None:
            raise InvalidRequest("a write needs at least one chunk", field="buffer_id")
        return pb.WriteBufferResponse(bytes_written=transfer.bytes_moved)

    @streaming
    async def ReadBuffer(self, request: pb.ReadBufferRequest, call: Call) -> AsyncIterator[bytes]:
        """Chunks encoded by hand (``accyd.doors.grpc.encoded``), one chunk copied ahead."""
        client_id = call.need_client()
        chunk_size = request.chunk_size or self._read_chunk
        if chunk_size > self._max_chunk:
            raise InvalidRequest(
                f"chunk_size {chunk_size} is past the largest message ({self._max_chunk})",
                field="chunk_size",
            )
        buffer_id = text_field(request.buffer_id, "buffer_id")
        bind(buffer_id=buffer_id)
        transfer = self.daemon.open_read(client_id, buffer_id)
        await transfer.settled()  # the writes before it, without a thread
        offset = request.offset
        size = request.size or max(transfer.byte_size - offset, 0)
        transfer.check_range(offset, size, "size" if request.size else "offset")
        end = offset + size
        # The device copies into one staging chunk, reused: each chunk leaves it, encoded,
        # before the next copy starts (one runs at a time).
        staging = memoryview(bytearray(min(chunk_size, size)))

        def copy_out(at: int, length: int) -> bytes:
            part = staging[:length]
            transfer.read_into(at, part)
            return encode_read_chunk(at, part)

        def fetch(at: int) -> asyncio.Task[bytes] | None:
            """Copy the chunk at ``at`` out on a device-work thread (None past the end)."""
            if at >= end:
                return None
            return asyncio.ensure_future(
                self.calls.work.run_for(client_id, copy_out, at, min(chunk_size, end - at))
            )

        # One chunk ahead: the next copy runs while this one is on the wire.
        ahead = fetch(offset)
        try:
            while ahead is not None:
                chunk = await ahead
                offset = min(offset + chunk_size, end)
                ahead = fetch(offset)
                yield chunk
        finally:
            if ahead is not None:
                ahead.cancel()

    @unary
    async def FreeBuffer(self, request: pb.FreeBufferRequest, call: Call) -> pb.FreeBufferResponse:
        client_id = call.need_client()
        buffer_id = text_field(request.buffer_id, "buffer_id")
        await self.daemon.free_buffer_async(client_id, buffer_id)
        return pb.FreeBufferResponse()

    # Shared memory ------------------------------------------------------------

    @unary
    async def OpenSegment(
        self, request: pb.OpenSegmentRequest, call: Call
    ) -> pb.OpenSegmentResponse:
        client_id = call.need_client()
        self.daemon.client(client_id)  # attached, or CLIENT_UNKNOWN
        _need_local(call, "segment", "byte_size")
        offer = await self.calls.work.run_for(
            client_id, self.segments.open, client_id, request.byte_size, request.device
        )
        bind(segment_id=offer.segment_id)
        return pb.OpenSegmentResponse(
            segment_id=offer.segment_id,
            ticket=offer.ticket,
            handoff_name=offer.handoff_name,
            byte_size=offer.byte_size,
        )

    @unary
    async def CopySegment(
        self, request: pb.CopySegmentRequest, call: Call
    ) -> pb.CopySegmentResponse:
        client_id = call.need_client()
        segment_id = text_field(request.segment_id, "segment_id")
        buffer_id = text_field(request.buffer_id, "buffer_id")
        to_buffer = _DIRECTIONS.get(request.direction)
        if to_buffer is None:
            raise InvalidRequest(
                "direction must be COPY_DIRECTION_TO_BUFFER or COPY_DIRECTION_TO_SEGMENT",
                field="direction",
            )
        bind(segment_id=segment_id, buffer_id=buffer_id)
        copy = self.segments.prepare(
            client_id,
            segment_id,
            request.segment_offset,
            buffer_id,
            request.buffer_offset,
            request.size,
            to_buffer=to_buffer,
        )
        try:  # the buffer's earlier work is awaited here, holding no thread
            await copy.transfer.settled()
        except BaseException:
            copy.abandon()
            raise
        copied = await self.calls.work.run_for(client_id, copy.run)
        return pb.CopySegmentResponse(bytes_copied=copied)

    @unary
    async def CloseSegment(
        self, request: pb.CloseSegmentRequest, call: Call
    ) -> pb.CloseSegmentResponse:
        client_id = call.need_client()
        segment_id = text_field(request.segment_id, "segment_id")
        await self.calls.work.run_for(client_id, self.segments.close, client_id, segment_id)
        return pb.CloseSegmentResponse()

    @unary
    async def ExportBuffer(
        self, request: pb.ExportBufferRequest, call: Call
    ) -> pb.ExportBufferResponse:
        client_id = call.need_client()
        buffer_id = text_field(request.buffer_id, "buffer_id")
        bind(buffer_id=buffer_id)
        _need_local(call, "buffer's memory", "buffer_id")
        transfer = self.segments.open_export(client_id, buffer_id)
        try:  # the buffer's earlier work is awaited here, holding no thread
            await transfer.settled()
        except BaseException:
            transfer.finish()
            raise
        offer = await self.calls.work.run_for(
            client_id, self.segments.export, client_id, buffer_id, transfer
        )
        exported = offer.exported
        return pb.ExportBufferResponse(
            export_id=offer.export_id,
            ticket=offer.ticket,
            handoff_name=offer.handoff_name,
            kind=_EXPORT_KINDS[exported.kind],
            mapping_size=exported.mapping_size,
            offset=exported.offset,
            byte_size=offer.byte_size,
            gpu_uuid=exported.gpu_uuid,
            device=offer.device,
        )

    # One call and status ------------------------------------------------------

    @unary
    async def Run(self, request: pb.RunRequest, call: Call) -> pb.RunResponse:
        return await self._launcher.run(request, call.client_id, self._principal(), call.started)

    @unary
    async def OpenRing(self, request: pb.OpenRingRequest, call: Call) -> pb.OpenRingResponse:
        client_id = call.need_client()
        self.daemon.client(client_id)  # attached, or CLIENT_UNKNOWN
        if self.rings is None:
            raise FailedPrecondition(
                "this daemon serves no Unix socket, so it hands out no rings: launch over gRPC",
                field="slots",
            )
        _need_local(call, "ring", "slots")
        offer = self.rings.offer(client_id, request.slots, device_waits=request.device_waits)
        return pb.OpenRingResponse(
            ring_id=offer.ring_id,
            ticket=offer.ticket,
            handoff_name=offer.handoff_name,
            slots=offer.slots,
        )

    @unary
    async def RingStream(self, request: AsyncIterator[pb.RingFrame], call: Call) -> None:
        client_id = call.need_client()
        if self._ring_streams is None:
            raise FailedPrecondition(
                "this daemon hands out no rings (--no-rings): launch with Launch calls",
                field="slots",
            )
        # Charged for the largest ring a stream may ask for (its first frame says which).
        usage = stream_ring_usage(MAX_SLOTS)
        client = self.daemon.charge(client_id, usage)
        ended = self._stream_ends.take(client_id)  # set by its detach: the stream then ends
        gone = asyncio.Event()  # set when the call is cancelled: its client went

        async def serve() -> None:
            try:
                await streams.serve(client_id, until_ended(request, ended), call.context, gone)
            finally:
                self._stream_ends.give_back(client_id)
                self.daemon.refund(client, usage)

        streams = self._ring_streams
        # Shielded: a call cancelled as its client goes must not cut the stream's cleanup
        # short (the engine letting its ring go). Its reads do not end with the call, so
        # ``gone`` ends them and drops the ring's records not yet decided.
        try:
            await self._serving.shielded(serve(), "ring stream")
        except asyncio.CancelledError:
            gone.set()
            raise

    @unary
    async def ReloadCatalog(
        self, request: pb.ReloadCatalogRequest, call: Call
    ) -> pb.ReloadCatalogResponse:
        change = await asyncio.to_thread(self.daemon.reload_catalog)  # one at a time, inside
        return pb.ReloadCatalogResponse(
            added=change.added,
            replaced=change.replaced,
            removed=change.removed,
            generation=change.generation,
        )

    @unary
    async def GetStatus(self, request: pb.GetStatusRequest, call: Call) -> pb.GetStatusResponse:
        principal = self._principal()
        admin = ADMIN_SCOPE in principal.scopes
        status = self.daemon.status(call.client_id, None if admin else (principal.tenant,))
        reply = convert.status_to_proto(status)
        reply.tenant = principal.tenant
        reply.restarts = self._lineage.restarts
        reply.device_faults = (
            self._lineage.device_faults
            + (self.daemon.fault is not None)
            + sum(d.replacements for d in status.devices)
        )
        return reply

    def _principal(self) -> Principal:
        """The caller, as the auth interceptor found it (the default tenant where none ran)."""
        return current_principal() or self._default_principal
