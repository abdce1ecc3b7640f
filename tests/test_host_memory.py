"""The host backend's memory limit: a default share of physical memory, refused before touching."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from accy.protocol.launch.v1 import launch_pb2 as pb
from accy.protocol.launch.v1 import launch_pb2_grpc
from accyd.backends.host import DEFAULT_MEMORY_SHARE, HostBackend, physical_memory
from accyd.errors import OutOfMemory
from accyd.server import Server
from tests.launch_service.harness import make_config


def test_the_host_backend_refuses_more_than_its_default_share_before_touching_memory() -> None:
    backend = HostBackend()
    try:
        share = int(physical_memory() * DEFAULT_MEMORY_SHARE)
        with pytest.raises(OutOfMemory, match="--host-memory-limit"):
            backend.allocate_buffer(share + 1)
        assert backend.memory_in_use() == 0
        backend.destroy(backend.allocate_buffer(4096))
    finally:
        backend.close()


def test_a_served_allocation_past_the_limit_is_resource_exhausted(tmp_path: Path) -> None:
    config = make_config(tmp_path, "unix", backend="host", host_memory_limit=1 << 20)

    async def scenario() -> grpc.aio.AioRpcError:
        server = Server(config, catalog=None)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(server.addresses[0]) as channel:
                stub = launch_pb2_grpc.LaunchServiceStub(channel)
                stream = stub.Attach(pb.AttachRequest(client_name="big"))
                attached = (await stream.read()).attached
                metadata = (("accy-client-id", attached.client_id),)
                small = pb.AllocateBufferRequest(byte_size=1 << 19)
                await stub.AllocateBuffer(small, metadata=metadata)
                try:
                    await stub.AllocateBuffer(
                        pb.AllocateBufferRequest(byte_size=1 << 20), metadata=metadata
                    )
                except grpc.aio.AioRpcError as error:
                    return error
                finally:
                    stream.cancel()
                raise AssertionError("an allocation past the limit succeeded")
        finally:
            await server.stop()

    error = asyncio.run(scenario())
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "memory limit of 1048576 bytes" in (error.details() or "")
