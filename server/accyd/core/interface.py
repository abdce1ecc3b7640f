"""The core as the doors see it: ``Core``, the one interface every door and engine is typed by.

``accyd.core.daemon.Daemon`` is the one implementation (checked where it is defined);
the server builds it and keeps it concretely for what only the server does (split SMs,
replace devices, drain, close). The doors, the ring and its engines, the shared segments
and the one-call path take a ``Core``, so a test may hand them anything with these
operations, and what a door may ask of the core is read here in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Protocol

from accyd.backends.base import Backend
from accyd.catalog.dtypes import DType, Scalar
from accyd.catalog.model import ArtifactFormat, Pipeline, ScalarSpec
from accyd.core.accounting import EngineCounts
from accyd.core.arguments import Tensor
from accyd.core.buffers import BufferRecord, Transfer
from accyd.core.catalogs import CatalogChange
from accyd.core.clients import Client
from accyd.core.device import DeviceHealth
from accyd.core.launching import LaunchTicket, WouldBlock
from accyd.core.sessions import LoadedSession
from accyd.core.status import DaemonStatus, TenantStatus
from accyd.core.tenants import DEFAULT_TENANT, Quotas, Usage
from accyd.core.tickets import Revoker
from accyd.errors import DeviceFault

__all__ = [
    "UNKNOWN_PIPELINE",
    "Core",
    "DaemonStatus",
    "Extension",
    "LaunchTicket",
    "LoadedSession",
    "TenantStatus",
    "Tensor",
    "WouldBlock",
]

UNKNOWN_PIPELINE = "unknown"
"""What ``pipeline_of`` says of a session it does not know (a bounded metrics label)."""


class Extension(Protocol):
    """What a door keeps per client beside the core's tables (rings, segments, exports)."""

    def close_client(self, client_id: str) -> object:
        """*Blocking*: the client detached: close what it holds here (before its buffers go)."""
        ...

    def device_replaced(self, device: int, backend: Backend) -> object:
        """``backend`` serves ``device`` now, after a fault (re-pin, re-target...)."""
        ...


class Core(Protocol):
    """Every operation a door calls, and no other (``Daemon``'s docstrings say what each does).

    *Blocking* ones may wait for the device or compile (call them off the event loop);
    ``*_async`` ones await the device on the event loop; the rest return at once.
    """

    # State and catalog ------------------------------------------------------------

    @property
    def instance_id(self) -> str: ...

    @property
    def backends(self) -> dict[int, Backend]: ...

    @property
    def backend(self) -> Backend: ...

    @property
    def serving(self) -> bool: ...

    @property
    def fault(self) -> DeviceFault | None: ...

    @property
    def launches_per_client(self) -> int | None: ...

    @property
    def catalog_generation(self) -> int: ...

    def pipelines(self) -> tuple[Pipeline, ...]: ...

    def formats_of(self, pipeline: Pipeline) -> tuple[ArtifactFormat, ...]: ...

    def backend_formats(self) -> tuple[ArtifactFormat, ...]: ...

    def reload_catalog(self) -> CatalogChange: ...

    def remove_pipeline(self, target: str) -> CatalogChange: ...

    def status(
        self, client_id: str | None = None, tenants: Collection[str] | None = None
    ) -> DaemonStatus: ...

    # Wiring at start --------------------------------------------------------------

    def extend(self, extension: Extension) -> None: ...

    def attach_engine(
        self, revoker: Revoker, counts: EngineCounts, watch: Callable[[DeviceHealth], None]
    ) -> None: ...

    def note_fault(
        self, fault: DeviceFault, session_id: str | None, device: int
    ) -> DeviceFault: ...

    # Clients ----------------------------------------------------------------------

    def attach(
        self, name: str = "", tenant: str = DEFAULT_TENANT, quotas: Quotas | None = None
    ) -> Client: ...

    def client(self, client_id: str) -> Client: ...

    def touch(self, client_id: str) -> None: ...

    def charge(self, client_id: str, usage: Usage) -> Client: ...

    def refund(self, client: Client, usage: Usage) -> None: ...

    def detach(self, client_id: str) -> None: ...

    async def detach_async(self, client_id: str) -> None: ...

    # Sessions and launches --------------------------------------------------------

    def load_pipeline(
        self,
        client_id: str,
        target: str,
        version: int = 0,
        format: ArtifactFormat | None = None,
        device: int | None = None,
        lowered: int = 0,
    ) -> LoadedSession: ...

    def session_scalars(self, client_id: str, session_id: str) -> tuple[ScalarSpec, ...]: ...

    def pipeline_of(self, client_id: str, session_id: str) -> str: ...

    def allocate_intermediates(
        self, client_id: str, session_id: str, scalars: Mapping[str, Scalar]
    ) -> int: ...

    def launch(
        self,
        client_id: str,
        session_id: str,
        operands: Sequence[str],
        results: Sequence[str],
        scalars: Mapping[str, Scalar],
        *,
        watch: bool = False,
        ticket_for: object | None = None,
        may_block: bool = False,
    ) -> LaunchTicket: ...

    def wait_launch(
        self, client_id: str, session_id: str, launch_id: str | None = None, *, reap: bool = True
    ) -> None: ...

    async def wait_launch_async(
        self, client_id: str, session_id: str, launch_id: str | None = None
    ) -> None: ...

    def reap(self, client_id: str, session_id: str) -> bool: ...

    async def release_async(self, client_id: str, session_id: str) -> None: ...

    # Buffers ----------------------------------------------------------------------

    def allocate_buffer(
        self,
        client_id: str,
        byte_size: int,
        dtype: DType | None = None,
        device: int | None = None,
        *,
        exportable: bool = False,
    ) -> BufferRecord: ...

    def check_buffer(self, client_id: str, buffer_id: str) -> None: ...

    def open_write(self, client_id: str, buffer_id: str) -> Transfer: ...

    def open_read(self, client_id: str, buffer_id: str) -> Transfer: ...

    def free_buffer(self, client_id: str, buffer_id: str) -> None: ...

    async def free_buffer_async(self, client_id: str, buffer_id: str) -> None: ...

    # The one call -----------------------------------------------------------------

    def run(
        self,
        client_id: str | None,
        target: str,
        version: int,
        format: ArtifactFormat | None,
        operands: Sequence[Tensor],
        scalars: Mapping[str, Scalar],
        *,
        tenant: str = DEFAULT_TENANT,
        quotas: Quotas | None = None,
    ) -> list[Tensor]: ...
