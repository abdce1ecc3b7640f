"""The standard health service (``grpc.health.v1``): SERVING when up, NOT_SERVING when draining."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from accyd.errors import Unavailable

__all__ = ["Health"]


class Health:
    """Health of the whole server ("") and of each named service, switched together."""

    def __init__(self, services: Sequence[str]) -> None:
        self.servicer = HealthServicer()
        self._names = ("", *services)

    def register(self, server: grpc.aio.Server) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)

    async def serve_alone(self, address: str) -> tuple[grpc.aio.Server, str]:
        """A second listener with the health service alone, plaintext: a probe's door; the
        server and the address it listens on."""
        server = grpc.aio.server()
        self.register(server)
        port = server.add_insecure_port(address)
        if port == 0:
            raise Unavailable(f"cannot listen on {address} for health probes")
        await server.start()
        return server, f"{address.rsplit(':', 1)[0]}:{port}"

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in self._names:
            await self.servicer.set(name, status)
