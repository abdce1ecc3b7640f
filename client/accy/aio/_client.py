"""``AsyncClient``: the asyncio facade over one attachment (``AioLink``) and what it makes."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

import grpc
import numpy as np

from accy import _chunks, _dtypes
from accy._chunks import DEFAULT_CHUNK_SIZE, Progress
from accy._connection import UNSET
from accy._credentials import PemSource, auth_metadata, client_credentials, resolve_token
from accy._dtypes import DTypeLike
from accy._models import Attachment, PipelineInfo, Status
from accy._requests import allocation_request, pick_pipeline, run_request, run_results
from accy._target import resolve_target
from accy.aio._link import AioLink
from accy.aio._objects import AsyncBuffer, AsyncSession
from accy.client import DEFAULT_LIVENESS, DEFAULT_TIMEOUT, check_liveness
from accy.errors import AccyError, ClientClosed
from accy.protocol.launch.v1 import launch_pb2 as pb

__all__ = ["AsyncClient"]


class AsyncClient:
    """One attached ``grpc.aio`` connection to an ``accyd`` daemon, for asyncio programs.

    The same options, objects and errors as ``accy.Client``, awaited::

        async with AsyncClient() as client:
            (y,) = await client.run("accy.kernel.device_scan", x)

    Opening (``await client.open()``, or ``async with``) attaches; ``close()``
    detaches and the daemon frees every session and buffer the client made. Make
    and use it on one event loop. On the daemon's own host launches go through its
    ring, as the blocking client's do, their waits awaited on the loop
    (``accy.aio._ring``); elsewhere (TCP, ``ACCY_RING=0``) as unary calls. The client
    does not attach again by itself: once its daemon restarted or detached it, calls
    raise ``Unavailable`` saying so.
    """

    def __init__(
        self,
        target: str | None = None,
        *,
        client_name: str | None = None,
        token: str | None = None,
        tls: bool = False,
        tls_ca: PemSource | None = None,
        tls_cert: PemSource | None = None,
        tls_key: PemSource | None = None,
        tls_server_name: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        attach_timeout: float = 10.0,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        liveness: float | None = DEFAULT_LIVENESS,
    ) -> None:
        self._target = resolve_target(target)
        self._chunk = _chunks.check_chunk_size(chunk_size)
        self._credentials = client_credentials(
            credentials, tls=tls, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key
        )
        self._liveness = check_liveness(liveness)
        self._token = resolve_token(token)
        self._server_name = tls_server_name
        self._timeout = timeout
        self._attach_timeout = attach_timeout
        self._name = client_name or f"accy-python-aio/{os.getpid()}"
        self._link: AioLink | None = None
        self._closed = False
        self._pipelines: dict[str, list[PipelineInfo]] | None = None

    # -- opening and closing ------------------------------------------------------------

    async def open(self) -> Self:
        """Attach (raising why not); returns the client. ``async with`` calls it."""
        if self._closed:
            raise ClientClosed(f"the client of {self._target} is closed; make a new AsyncClient")
        if self._link is not None:
            return self
        link = AioLink(
            self._target,
            self._credentials,
            server_name=self._server_name,
            auth=auth_metadata(self._token),
            has_token=self._token is not None,
            timeout=self._timeout,
            chunk_size=self._chunk,
        )
        try:
            await link.attach(self._name, self._liveness, self._attach_timeout)
        except BaseException:
            await link.close()
            raise
        self._link = link
        return self

    async def close(self) -> None:
        """Detach: the daemon frees every session and buffer this client made; idempotent."""
        self._closed = True
        link, self._link = self._link, None
        if link is not None:
            await link.close()

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _attached(self) -> AioLink:
        link = self._link
        if link is None:
            if self._closed:
                raise ClientClosed(
                    f"the client of {self._target} is closed; make a new AsyncClient"
                )
            raise ClientClosed(
                f"the client of {self._target} is not open: use `async with AsyncClient()` "
                "or `await client.open()` first"
            )
        return link

    # -- settings and identity ----------------------------------------------------------

    @property
    def target(self) -> str:
        """The address this client dials (``unix:PATH`` or ``HOST:PORT``)."""
        return self._target

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def attached(self) -> bool:
        """Whether the client is attached now (open, and its daemon has not let it go)."""
        return self._link is not None and self._link.lost is None

    @property
    def attachment(self) -> Attachment:
        """Who this client is to the daemon."""
        attachment = self._attached().attachment
        assert attachment is not None  # set by open()
        return attachment

    @property
    def client_id(self) -> str:
        return self.attachment.client_id

    # -- the catalog and the daemon -------------------------------------------------------

    async def pipelines(self) -> list[PipelineInfo]:
        """Every pipeline in the daemon's catalog."""
        link = self._attached()
        response = await link.call(link.stub.ListPipelines, pb.ListPipelinesRequest())
        infos = [PipelineInfo.from_proto(p) for p in response.pipelines]
        by_target: dict[str, list[PipelineInfo]] = {}
        for info in infos:
            by_target.setdefault(info.target, []).append(info)
        self._pipelines = by_target
        return infos

    async def pipeline(self, target: str, version: int = 0) -> PipelineInfo:
        """One pipeline's description (``version`` 0: the newest); ``NotFound`` if unknown."""
        known = None if self._pipelines is None else self._pipelines.get(target)
        if known is None:
            await self.pipelines()
            assert self._pipelines is not None
            known = self._pipelines.get(target, [])
        return pick_pipeline(known, target, version)

    async def status(self) -> Status:
        """The daemon's state as this client may see it."""
        link = self._attached()
        return Status.from_proto(await link.call(link.stub.GetStatus, pb.GetStatusRequest()))

    # -- sessions and buffers ---------------------------------------------------------------

    async def load(
        self, target: str, version: int = 0, format: str = "", *, device: int | None = None
    ) -> AsyncSession:
        """Create (or return, if this client has it) the session for this pipeline."""
        link = self._attached()
        request = pb.LoadPipelineRequest(
            target=target, version=version, format=format, device=device
        )
        return AsyncSession._made(link, await link.call(link.stub.LoadPipeline, request))

    async def _allocate(
        self,
        nbytes: int,
        dtype: np.dtype[Any] | None,
        device: int | None,
        shape: tuple[int, ...] | None,
    ) -> AsyncBuffer:
        request = allocation_request(nbytes, dtype, device, False)
        link = self._attached()
        response = await link.call(link.stub.AllocateBuffer, request)
        return AsyncBuffer._made(link, response, nbytes, dtype, shape)

    async def buffer(
        self,
        array_or_nbytes: np.ndarray[Any, Any] | Sequence[Any] | int,
        dtype: DTypeLike | None = None,
        *,
        device: int | None = None,
        progress: Progress | None = None,
    ) -> AsyncBuffer:
        """A device buffer: of ``nbytes`` bytes, or holding a copy of an array (as
        ``Client.buffer``)."""
        if isinstance(array_or_nbytes, int | np.integer):
            kind = _dtypes.to_numpy(dtype) if dtype is not None else None
            return await self._allocate(int(array_or_nbytes), kind, device, None)
        array = np.asarray(array_or_nbytes, dtype=dtype)
        kind = _dtypes.to_numpy(array.dtype)
        buffer = await self._allocate(array.size * kind.itemsize, kind, device, array.shape)
        try:
            await buffer.write(array, progress=progress)
        except BaseException:
            with contextlib.suppress(AccyError):
                await buffer.free()
            raise
        return buffer

    async def empty(
        self, shape: int | tuple[int, ...], dtype: DTypeLike, *, device: int | None = None
    ) -> AsyncBuffer:
        """A device buffer of ``shape`` (a count of elements, or dims) of ``dtype``."""
        kind = _dtypes.to_numpy(dtype)
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        shaped = dims if not isinstance(shape, int) else None
        return await self._allocate(math.prod(dims) * kind.itemsize, kind, device, shaped)

    async def run(
        self,
        target: str,
        *operands: np.ndarray[Any, Any],
        version: int = 0,
        format: str = "",
        timeout: float | None = UNSET,
        **scalars: float,
    ) -> list[np.ndarray[Any, Any]]:
        """Run a pipeline in one call: operands inline, results returned (as ``Client.run``)."""
        info = await self.pipeline(target, version)
        request, values = run_request(info, target, version, format, operands, scalars)
        link = self._attached()
        return run_results(info, await link.call(link.stub.Run, request, timeout), values)
