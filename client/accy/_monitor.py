"""``Monitor``: the daemon's status and catalog without attaching, as a ``status`` token may ask.

A ``Client`` attaches first (the Attach stream needs the ``launch`` scope); a monitoring
token holds ``status`` alone, which admits GetStatus and ListPipelines and nothing else.
``accy status`` and ``accy pipelines`` ask through this, so neither attaches, nor shows up
among the clients it reports.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self, TypeVar

import grpc

from accy._credentials import PemSource, auth_metadata, channel_credentials, resolve_token
from accy._failures import translate
from accy._models import PipelineInfo, Status
from accy._rpc import Stub, open_channel
from accy._target import resolve_target
from accy.client import DEFAULT_TIMEOUT
from accy.protocol.launch.v1 import launch_pb2 as pb

__all__ = ["Monitor"]

_T = TypeVar("_T")


class Monitor:
    """Unattached calls to one daemon: ``status()``, ``pipelines()`` and, for an ``admin``
    token, ``reload_catalog()``.

    Takes the target, credentials and ``timeout`` of ``Client``; errors are the same
    typed ``AccyError`` a client's calls raise.
    """

    def __init__(
        self,
        target: str | None = None,
        *,
        token: str | None = None,
        tls: bool = False,
        tls_ca: PemSource | None = None,
        tls_cert: PemSource | None = None,
        tls_key: PemSource | None = None,
        tls_server_name: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> None:
        if credentials is not None and (tls or tls_ca or tls_cert or tls_key):
            raise ValueError("pass either credentials or the tls options, not both")
        self.target = resolve_target(target)
        self.timeout = timeout
        secure = credentials or channel_credentials(
            tls=tls, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key
        )
        token = resolve_token(token)
        self._secure = secure is not None
        self._has_token = token is not None
        self._metadata = auth_metadata(token)
        self._channel = open_channel(self.target, secure, server_name=tls_server_name)
        self._stub = Stub(self._channel)

    def _call(self, method: grpc.UnaryUnaryMultiCallable[Any, _T], request: Any) -> _T:
        try:
            return method(request, metadata=self._metadata, timeout=self.timeout)
        except grpc.RpcError as error:
            raise translate(
                error, target=self.target, secure=self._secure, has_token=self._has_token
            ) from error

    def status(self) -> Status:
        """The daemon's state, as the token's tenant may see it (every tenant's for ``admin``)."""
        return Status.from_proto(self._call(self._stub.GetStatus, pb.GetStatusRequest()))

    def pipelines(self) -> list[PipelineInfo]:
        """Every pipeline in the daemon's catalog."""
        response = self._call(self._stub.ListPipelines, pb.ListPipelinesRequest())
        return [PipelineInfo.from_proto(p) for p in response.pipelines]

    def reload_catalog(self) -> dict[str, Any]:
        """Have the daemon read its catalog folders again (an ``admin`` token): the pipelines
        added, replaced and removed, as ``target vN``, and the catalog's generation."""
        reply = self._call(self._stub.ReloadCatalog, pb.ReloadCatalogRequest())
        return {
            "added": list(reply.added),
            "replaced": list(reply.replaced),
            "removed": list(reply.removed),
            "generation": reply.generation,
        }

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
