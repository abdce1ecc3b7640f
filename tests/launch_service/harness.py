"""A real grpc.aio server in a background thread (its own event loop), and typed client helpers."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped, unused-ignore]
from grpc_status import rpc_status

from accy.protocol.launch.v1 import launch_pb2 as pb
from accy.protocol.launch.v1 import launch_pb2_grpc
from accyd.backends.host import HostBackend
from accyd.catalog import Catalog, load_catalog
from accyd.server import Server
from accyd.settings.config import Config

CATALOG = load_catalog()


class ServerThread:
    """``Server`` running on a loop of its own; ``stop()`` runs its ordered shutdown."""

    def __init__(
        self, config: Config, catalog: Catalog = CATALOG, backend: HostBackend | None = None
    ) -> None:
        self.backend = backend or HostBackend()
        self.server = Server(config, backends={0: self.backend}, catalog=catalog)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        try:
            self.call(self.server.start())
        except BaseException:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.backend.close()
            raise

    def call(self, coroutine: Any, timeout: float = 30.0) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return future.result(timeout)

    def stop(self) -> None:
        self.call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    @property
    def address(self) -> str:
        return self.server.addresses[0]


def make_config(folder: Path, transport: str, **overrides: Any) -> Config:
    address = f"unix:{folder / 'accyd.sock'}" if transport == "unix" else "127.0.0.1:0"
    settings: dict[str, Any] = {
        "listen": (address,),
        "insecure": True,
        "heartbeat_seconds": 0.2,
        "grace_seconds": 5.0,
        "blocking_threads": 8,
        **overrides,
    }
    return Config(**settings).validate()


@dataclass
class Attached:
    """One attached client: its stub, its id and the Attach stream that keeps it alive."""

    stub: launch_pb2_grpc.LaunchServiceStub
    stream: Any
    client_id: str
    metadata: tuple[tuple[str, str], ...] = field(init=False)

    def __post_init__(self) -> None:
        self.metadata = (("accy-client-id", self.client_id),)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.stub, name)
        return lambda request, **kw: method(request, metadata=self.metadata, **kw)

    def detach(self) -> None:
        self.stream.cancel()


def attach(channel: grpc.Channel, name: str = "test") -> Attached:
    stub = launch_pb2_grpc.LaunchServiceStub(channel)
    stream = stub.Attach(pb.AttachRequest(client_name=name))
    event = next(stream)
    return Attached(stub, stream, event.attached.client_id)


def rpc_error(call: Any) -> grpc.RpcError:
    try:
        call()
    except grpc.RpcError as error:
        return error
    raise AssertionError("the call succeeded")


def details(error: grpc.RpcError) -> dict[str, Any]:
    """The google.rpc details of a failed call, by kind."""
    status: status_pb2.Status | None = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None, "no rich status"
    return status_details(status)


def status_details(status: status_pb2.Status) -> dict[str, Any]:
    """The details of a google.rpc.Status (a failed call's, or a streamed launch's), by kind."""
    found: dict[str, Any] = {}
    for packed in status.details:
        for kind in ("ErrorInfo", "BadRequest", "QuotaFailure", "RequestInfo"):
            message = getattr(error_details_pb2, kind)()
            if packed.Is(message.DESCRIPTOR):
                packed.Unpack(message)
                found[kind] = message
    return found


def field_of(error: grpc.RpcError) -> str:
    return str(details(error)["BadRequest"].field_violations[0].field)


def chunks(buffer_id: str, data: bytes, size: int) -> Iterator[pb.WriteBufferChunk]:
    for offset in range(0, len(data), size):
        yield pb.WriteBufferChunk(
            buffer_id=buffer_id if offset == 0 else "",
            offset=offset,
            data=data[offset : offset + size],
        )
