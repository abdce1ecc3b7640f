"""A typed stub of accy.launch.v1.LaunchService, built from the service descriptor."""

from __future__ import annotations

from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from accy.protocol.launch.v1 import launch_pb2 as pb

__all__ = [
    "SERVICE_NAME",
    "Stub",
    "channel_options",
    "method_path",
    "open_aio_channel",
    "open_channel",
]

_SERVICE = pb.DESCRIPTOR.services_by_name["LaunchService"]
SERVICE_NAME = _SERVICE.full_name

_Req = TypeVar("_Req", bound=Message)
_Resp = TypeVar("_Resp", bound=Message)


def channel_options() -> list[tuple[str, int]]:
    """Options of every accy client channel: no cap on messages, prompt reconnection.

    A daemon that restarts (after a device fault, in well under a second)
    should find its clients reconnecting within half a second, not after
    gRPC's default back-off of up to two minutes.
    """
    return [
        ("grpc.max_receive_message_length", -1),
        ("grpc.max_send_message_length", -1),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 500),
    ]


def open_channel(
    target: str,
    credentials: grpc.ChannelCredentials | None = None,
    *,
    server_name: str | None = None,
) -> grpc.Channel:
    """A channel to ``target`` (already resolved): TLS when ``credentials`` are given.

    ``server_name`` is the name to check the daemon's certificate against,
    where it differs from the target's host.
    """
    options = _options(credentials, server_name)
    if credentials is None:
        return grpc.insecure_channel(target, options)
    return grpc.secure_channel(target, credentials, options)


def open_aio_channel(
    target: str,
    credentials: grpc.ChannelCredentials | None = None,
    *,
    server_name: str | None = None,
) -> grpc.aio.Channel:
    """``open_channel``'s channel for asyncio (``grpc.aio``), with the same options."""
    options = _options(credentials, server_name)
    if credentials is None:
        return grpc.aio.insecure_channel(target, options)
    return grpc.aio.secure_channel(target, credentials, options)


def _options(
    credentials: grpc.ChannelCredentials | None, server_name: str | None
) -> list[tuple[str, Any]]:
    options: list[tuple[str, Any]] = list(channel_options())
    if credentials is not None and server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    return options


def method_path(name: str) -> str:
    """The full path of one method of the launch service (``/accy.launch.v1.../Launch``)."""
    return f"/{SERVICE_NAME}/{_SERVICE.methods_by_name[name].name}"


class Stub:
    """One typed multi-callable per RPC of the launch service."""

    def __init__(self, channel: grpc.Channel) -> None:
        def uu(
            name: str, req: type[_Req], resp: type[_Resp]
        ) -> grpc.UnaryUnaryMultiCallable[_Req, _Resp]:
            return channel.unary_unary(method_path(name), req.SerializeToString, resp.FromString)

        def us(
            name: str, req: type[_Req], resp: type[_Resp]
        ) -> grpc.UnaryStreamMultiCallable[_Req, _Resp]:
            return channel.unary_stream(method_path(name), req.SerializeToString, resp.FromString)

        def su(
            name: str, req: type[_Req], resp: type[_Resp]
        ) -> grpc.StreamUnaryMultiCallable[_Req, _Resp]:
            return channel.stream_unary(method_path(name), req.SerializeToString, resp.FromString)

        def ss(
            name: str, req: type[_Req], resp: type[_Resp]
        ) -> grpc.StreamStreamMultiCallable[_Req, _Resp]:
            return channel.stream_stream(method_path(name), req.SerializeToString, resp.FromString)

        self.Attach = us("Attach", pb.AttachRequest, pb.AttachEvent)
        self.Ping = uu("Ping", pb.PingRequest, pb.PingResponse)
        self.ListPipelines = uu("ListPipelines", pb.ListPipelinesRequest, pb.ListPipelinesResponse)
        self.ReloadCatalog = uu("ReloadCatalog", pb.ReloadCatalogRequest, pb.ReloadCatalogResponse)
        self.LoadPipeline = uu("LoadPipeline", pb.LoadPipelineRequest, pb.LoadPipelineResponse)
        self.AllocateIntermediates = uu(
            "AllocateIntermediates",
            pb.AllocateIntermediatesRequest,
            pb.AllocateIntermediatesResponse,
        )
        self.Launch = uu("Launch", pb.LaunchRequest, pb.LaunchResponse)
        self.WaitLaunch = uu("WaitLaunch", pb.WaitLaunchRequest, pb.WaitLaunchResponse)
        self.Release = uu("Release", pb.ReleaseRequest, pb.ReleaseResponse)
        self.AllocateBuffer = uu(
            "AllocateBuffer", pb.AllocateBufferRequest, pb.AllocateBufferResponse
        )
        self.WriteBuffer = su("WriteBuffer", pb.WriteBufferChunk, pb.WriteBufferResponse)
        self.ReadBuffer = us("ReadBuffer", pb.ReadBufferRequest, pb.ReadBufferChunk)
        self.FreeBuffer = uu("FreeBuffer", pb.FreeBufferRequest, pb.FreeBufferResponse)
        self.Run = uu("Run", pb.RunRequest, pb.RunResponse)
        self.GetStatus = uu("GetStatus", pb.GetStatusRequest, pb.GetStatusResponse)
        self.OpenRing = uu("OpenRing", pb.OpenRingRequest, pb.OpenRingResponse)
        self.RingStream = ss("RingStream", pb.RingFrame, pb.RingState)
        self.OpenSegment = uu("OpenSegment", pb.OpenSegmentRequest, pb.OpenSegmentResponse)
        self.CopySegment = uu("CopySegment", pb.CopySegmentRequest, pb.CopySegmentResponse)
        self.CloseSegment = uu("CloseSegment", pb.CloseSegmentRequest, pb.CloseSegmentResponse)
        self.ExportBuffer = uu("ExportBuffer", pb.ExportBufferRequest, pb.ExportBufferResponse)
