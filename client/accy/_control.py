"""The blocking client's control plane: every call that is not a launch or a buffer's bytes.

``Session``, ``Buffer`` and ``Client`` ask a ``Control`` to load, allocate, release,
free, export, list, report and run; it builds each request message, makes the call
on its ``Connection`` and hands back plain values (``Loaded``, ``Allocated``,
``PipelineInfo``, ``Status``, arrays). So no API object builds a protobuf, and the
data plane (launches, waits, bytes, copies) is the link's ``Transport``
(``accy._seam``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from accy._connection import UNSET, Connection
from accy._link import Link
from accy._models import PipelineInfo, Status
from accy._requests import allocation_request, run_request, run_results
from accy._scalars import pack_scalars
from accy.errors import AccyError
from accy.protocol.launch.v1 import launch_pb2 as pb

__all__ = ["Allocated", "Control", "Loaded"]


@dataclass(frozen=True)
class Loaded:
    """A load the daemon answered: the session's id there, and what it is."""

    session_id: str
    created: bool
    format: str
    info: PipelineInfo
    device: int


@dataclass(frozen=True)
class Allocated:
    """A buffer the daemon allocated."""

    buffer_id: str
    byte_size: int
    """Its capacity (at least the bytes asked for)."""
    device: int


class Control:
    """One connection's control calls; ``conn`` is the connection itself (its links, its
    timeouts), for the objects that hold this."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    # -- the catalog, the daemon, one-call runs --------------------------------------------

    def pipelines(self) -> tuple[list[PipelineInfo], Link]:
        """Every pipeline in the daemon's catalog, and the link that answered."""
        conn = self.conn
        response, link = conn.call(conn.stub.ListPipelines, pb.ListPipelinesRequest())
        return [PipelineInfo.from_proto(p) for p in response.pipelines], link

    def status(self) -> Status:
        conn = self.conn
        return Status.from_proto(conn.unary(conn.stub.GetStatus, pb.GetStatusRequest()))

    def run(
        self,
        info: PipelineInfo,
        target: str,
        version: int,
        format: str,
        arrays: Sequence[np.ndarray[Any, Any]],
        scalars: Mapping[str, float],
        timeout: float | None = UNSET,
    ) -> list[np.ndarray[Any, Any]]:
        """``Client.run``: operands inline, results back in their shapes."""
        request, values = run_request(info, target, version, format, arrays, scalars)
        conn = self.conn
        return run_results(info, conn.unary(conn.stub.Run, request, timeout), values)

    # -- sessions ---------------------------------------------------------------------------

    def load(
        self, target: str, version: int, format: str, device: int | None, link: Link | None = None
    ) -> tuple[Loaded, Link]:
        """Load a pipeline (on ``link``; default: the current one)."""
        conn = self.conn
        request = pb.LoadPipelineRequest(
            target=target, version=version, format=format, device=device
        )
        response, used = conn.call(conn.stub.LoadPipeline, request, link=link)
        loaded = Loaded(
            response.session_id,
            response.created,
            response.format,
            PipelineInfo.from_proto(response.pipeline),
            response.device,
        )
        return loaded, used

    def allocate_intermediates(
        self,
        info: PipelineInfo,
        scalars: Mapping[str, float],
        session_id_on: Callable[[Link], str],
        link: Link | None = None,
    ) -> int:
        """A session's scratch for ``scalars``, its bytes. On ``link``, once; else on the
        current link, sent again (with the id there) if the client attached again."""
        packed = pack_scalars(info.runtime_scalars, scalars)
        conn = self.conn

        def request(on: Link) -> pb.AllocateIntermediatesRequest:
            return pb.AllocateIntermediatesRequest(
                session_id=session_id_on(on), runtime_scalars=packed
            )

        if link is not None:
            response, _ = conn.call(conn.stub.AllocateIntermediates, request(link), link=link)
        else:
            response = conn.unary(conn.stub.AllocateIntermediates, request)
        return int(response.byte_size)

    def release(self, session_id: str, link: Link) -> None:
        """Release one load of a session; a link lost meanwhile took it already."""
        self._on_link(self.conn.stub.Release, pb.ReleaseRequest(session_id=session_id), link)

    def release_later(self, session_id: str, link: Link) -> None:
        """The same, in the background (a safety net's), ignoring errors."""
        self._later(self.conn.stub.Release, pb.ReleaseRequest(session_id=session_id), link)

    # -- buffers ----------------------------------------------------------------------------

    def allocate(
        self, nbytes: int, dtype: np.dtype[Any] | None, device: int | None, exportable: bool
    ) -> tuple[Allocated, Link]:
        """A new buffer on the current link; a negative size is refused before any call."""
        conn = self.conn
        request = allocation_request(nbytes, dtype, device, exportable)
        response, link = conn.call(conn.stub.AllocateBuffer, request)
        return Allocated(response.buffer_id, response.byte_size, response.device), link

    def free(self, buffer_id: str, link: Link) -> None:
        """Free a buffer; a link lost meanwhile took it already."""
        self._on_link(self.conn.stub.FreeBuffer, pb.FreeBufferRequest(buffer_id=buffer_id), link)

    def free_later(self, buffer_id: str, link: Link) -> None:
        """The same, in the background (a safety net's), ignoring errors."""
        self._later(self.conn.stub.FreeBuffer, pb.FreeBufferRequest(buffer_id=buffer_id), link)

    def export_offer(
        self, buffer_id: str, link: Link, timeout: float | None
    ) -> pb.ExportBufferResponse:
        """The daemon's offer of a buffer's memory, for ``accy._export.map_export``."""
        conn = self.conn
        request = pb.ExportBufferRequest(buffer_id=buffer_id)
        return conn.call(conn.stub.ExportBuffer, request, timeout, link=link)[0]

    # -- helpers ------------------------------------------------------------------------------

    def _on_link(self, method: Any, request: Any, link: Link) -> None:
        try:
            self.conn.call(method, request, link=link)
        except AccyError:
            if link.lost is None:
                raise

    def _later(self, method: Any, request: Any, link: Link) -> None:
        conn = self.conn
        conn.later(lambda: conn.call(method, request, link=link))
