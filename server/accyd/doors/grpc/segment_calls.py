"""The shared-memory RPCs (OpenSegment, CopySegment, CloseSegment, ExportBuffer), mixed into
the servicer."""

from __future__ import annotations

from accy.protocol.launch.v1 import launch_pb2 as pb
from accyd.backends.base import ExportKind
from accyd.core.daemon import Daemon
from accyd.doors.grpc.calls import Call, CallTracker, text_field, unary
from accyd.doors.hostmem import Segments
from accyd.errors import FailedPrecondition, InvalidRequest
from accyd.logs import bind

__all__ = ["SegmentHandlers", "need_local"]

_DIRECTIONS = {pb.COPY_DIRECTION_TO_BUFFER: True, pb.COPY_DIRECTION_TO_SEGMENT: False}
_EXPORT_KINDS = {
    ExportKind.CUDA_VMM: pb.EXPORT_KIND_CUDA_VMM,
    ExportKind.HOST_MEMFD: pb.EXPORT_KIND_HOST_MEMFD,
}


def need_local(call: Call, what: str, field: str) -> None:
    """Refuse to share memory with a caller that cannot take it: the descriptors go over the
    Unix socket's handoff, so a call that came over TCP never could (it would only hold the
    daemon's memory and descriptors until the offer expired)."""
    peer = call.context.peer() or ""
    if not peer.startswith("unix:"):
        raise FailedPrecondition(
            f"this call came over TCP ({peer or 'an unknown peer'}): the daemon shares a {what} "
            "only with clients on its Unix socket; write and read buffers over gRPC instead",
            field=field,
        )


class SegmentHandlers:
    """Handlers over ``segments``; the servicer sets ``daemon``, ``calls`` and ``segments``."""

    daemon: Daemon
    calls: CallTracker
    segments: Segments

    @unary
    async def OpenSegment(
        self, request: pb.OpenSegmentRequest, call: Call
    ) -> pb.OpenSegmentResponse:
        client_id = call.need_client()
        self.daemon.client(client_id)  # attached, or CLIENT_UNKNOWN
        need_local(call, "segment", "byte_size")
        offer = await self.calls.blocking_for(
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
        copied = await self.calls.blocking_for(client_id, copy.run)
        return pb.CopySegmentResponse(bytes_copied=copied)

    @unary
    async def CloseSegment(
        self, request: pb.CloseSegmentRequest, call: Call
    ) -> pb.CloseSegmentResponse:
        client_id = call.need_client()
        segment_id = text_field(request.segment_id, "segment_id")
        await self.calls.blocking_for(client_id, self.segments.close, client_id, segment_id)
        return pb.CloseSegmentResponse()

    @unary
    async def ExportBuffer(
        self, request: pb.ExportBufferRequest, call: Call
    ) -> pb.ExportBufferResponse:
        client_id = call.need_client()
        buffer_id = text_field(request.buffer_id, "buffer_id")
        bind(buffer_id=buffer_id)
        need_local(call, "buffer's memory", "buffer_id")
        transfer = self.segments.open_export(client_id, buffer_id)
        try:  # the buffer's earlier work is awaited here, holding no thread
            await transfer.settled()
        except BaseException:
            transfer.finish()
            raise
        offer = await self.calls.blocking_for(
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
