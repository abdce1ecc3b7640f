"""The core facade: every operation a front door may call, over clients, sessions and buffers.

Operations take and return plain data (ids, numbers, dataclasses). Those marked *blocking*
may wait for the device or compile, and run off the event loop; the ``*_async`` ones await
the device's completions on the event loop and park no thread; the rest only enqueue and
return. Tables change under one lock, never held across a device allocation or a wait.

Every operation is a method here, most a one-line hand-off to the part that does it
(``Holdings``, ``Launching``, ``Replacing``, ``Catalogs``), composed over one ``Tables``.
The doors see it through ``accyd.core.interface.Core``; doors extend it with what they
keep per client (``Extension``: rings, segments, exports), closed with the client, in the
order added, before its sessions and buffers go.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING

import structlog

from accyd.backends.base import Backend
from accyd.backends.partitions import PartitionSpec
from accyd.catalog.dtypes import DType, Scalar
from accyd.catalog.model import ArtifactFormat, Pipeline, ScalarSpec
from accyd.core.accounting import DEFAULT_LAUNCHES_PER_CLIENT, EngineCounts, Ledger
from accyd.core.arguments import Tensor
from accyd.core.buffers import BufferRecord, Transfer
from accyd.core.catalogs import CatalogChange, Catalogs
from accyd.core.clients import Client, ClientTable
from accyd.core.device import DeviceHealth
from accyd.core.executor import allocate_intermediates, intermediate_byte_sizes
from accyd.core.holdings import ONE_CLIENT, CatalogView, Holdings
from accyd.core.ids import CLIENT, INSTANCE, new_id
from accyd.core.interface import UNKNOWN_PIPELINE, Core, Extension
from accyd.core.launching import Launching, LaunchTicket, WouldBlock
from accyd.core.limits import DaemonLimits
from accyd.core.replacing import Replacing
from accyd.core.run import run
from accyd.core.sessions import LoadedSession, order_scalars
from accyd.core.status import DaemonStatus, TenantStatus, status_of
from accyd.core.tables import Tables
from accyd.core.tenants import DEFAULT_TENANT, Placement, Quotas, Usage
from accyd.core.tickets import Revoker
from accyd.errors import AccyError, DeviceFault, NotFound

__all__ = [
    "UNKNOWN_PIPELINE",
    "CatalogView",
    "Core",
    "Daemon",
    "DaemonStatus",
    "Extension",
    "LaunchTicket",
    "LoadedSession",
    "TenantStatus",
    "Tensor",
    "WouldBlock",
]


log = structlog.get_logger("accyd.core")


class Daemon:
    """The one way in: attach, load, allocate, launch, wait, release, buffers, run, status."""

    def __init__(
        self,
        catalog: CatalogView,
        backends: Mapping[int, Backend],
        *,
        quotas: Quotas | None = None,
        tenant_quotas: Mapping[str, Quotas] | None = None,
        launches_per_client: int | None = DEFAULT_LAUNCHES_PER_CLIENT,
        on_fault: Callable[[DeviceFault], None] | None = None,
        on_quota_refused: Callable[[str, str], None] | None = None,
        isolated: bool = False,
        catalog_source: Callable[[], CatalogView] | None = None,
    ) -> None:
        """``isolated``: each backend runs in a process of its own, so a fault on one device
        is that device's alone (``on_fault`` then replaces it: ``replace_device``).
        ``catalog_source`` reads the catalog again, for ``reload_catalog``."""
        if not backends:
            raise ValueError("the daemon needs at least one device")
        lock = threading.RLock()
        ledger = Ledger(
            lock,
            quotas or Quotas(),
            tenant_quotas or {},
            launches_per_client=launches_per_client,
            on_refused=on_quota_refused,
        )
        table = dict(backends)
        state = DeviceHealth(lock, table, on_fault, isolated=isolated)
        self._t = Tables(table, lock, ledger, state, ClientTable())
        self._holdings = Holdings(self._t)
        self._launching = Launching(self._t)
        self._replacing = Replacing(self._t)
        self._extensions: list[Extension] = []
        self._catalogs = Catalogs(catalog, lock, catalog_source)
        self.instance_id = new_id(INSTANCE, 9)
        self._started_at = time.monotonic()

    # State ------------------------------------------------------------------

    @property
    def backends(self) -> dict[int, Backend]:
        return self._t.backends

    @property
    def backend(self) -> Backend:
        """The first device's backend (what status and the formats list describe)."""
        return self._t.backends[min(self._t.backends)]

    @property
    def serving(self) -> bool:
        return self._t.state.serving

    @property
    def fault(self) -> DeviceFault | None:
        return self._t.state.fault

    @property
    def launches_per_client(self) -> int | None:
        """The per-client limit on launches in flight (``None``: none)."""
        return self._t.ledger.launches_per_client

    @property
    def launches_total(self) -> int:
        return self._launching.launches_total

    @property
    def launches_failed(self) -> int:
        return self._launching.launches_failed

    def device_lost(self, device: int, fault: DeviceFault) -> None:
        """Isolated ``device`` was lost outside any call (its worker process died): latch it,
        which has it replaced (``on_fault``)."""
        self._t.state.device_lost(device, fault)

    def note_fault(self, fault: DeviceFault, session_id: str | None, device: int) -> DeviceFault:
        """A fault met outside any call (an engine's launch or completion on ``device``):
        latch it as every door's wait latches it; the error to report in its place."""
        return self._t.state.noted(fault, session_id, self._t.backends.get(device))

    def begin_drain(self) -> None:
        """Refuse new work from now on (``Unavailable``); reads, waits and frees still work."""
        self._t.state.begin_drain()

    def wait_idle(self, timeout: float) -> bool:
        """*Blocking*: wait up to ``timeout`` seconds for every launch so far; True if all done."""
        return self._holdings.wait_idle(timeout)

    def set_limits(self, limits: DaemonLimits) -> None:
        """The daemon's ceilings and each tenant's default shares (``accyd.core.limits``)."""
        with self._t.lock:
            self._t.ledger.set_limits(limits)

    def attach_engine(
        self,
        revoker: Revoker,
        counts: EngineCounts,
        watch: Callable[[DeviceHealth], None],
    ) -> None:
        """A ring engine that launches tickets by itself: its epochs, its counters, and a
        watcher of the device state (drain, faults) that it stops or goes on by."""
        with self._t.lock:
            self._t.revoker = revoker
            self._t.ledger.engine = counts
            self._t.state.watchers.append(watch)

    def extend(self, extension: Extension) -> None:
        """Close ``extension``'s share of each client as the client detaches, and tell it of
        devices replaced; in the order added (a ring door first: nothing of a client's rings
        is taken after that)."""
        self._extensions.append(extension)

    # Clients ----------------------------------------------------------------

    def attach(
        self, name: str = "", tenant: str = DEFAULT_TENANT, quotas: Quotas | None = None
    ) -> Client:
        """A new client of ``tenant``; ``quotas`` (from its credentials) replace the tenant's."""
        t = self._t
        with t.lock:
            t.state.check_serving()
            owner = t.ledger.tenant(tenant)
            client = Client(new_id(CLIENT), name, owner)
            if quotas is not None and quotas != owner.quotas:
                owner.quotas = quotas
                if t.ledger.engine is not None:
                    t.ledger.engine.published(client)
            t.ledger.charge(client, ONE_CLIENT)  # clients per tenant (refunded at detach)
            t.clients.add(client)
        log.info("client attached", client_id=client.id, tenant=tenant, client_name=name)
        return client

    def client(self, client_id: str) -> Client:
        """The attached client (marked seen); ``NotFound`` once it detached."""
        with self._t.lock:
            return self._t.clients.get(client_id)

    def touch(self, client_id: str) -> None:
        """The client is alive: a ring's records count as calls for liveness."""
        client = self._t.clients.find(client_id)
        if client is not None:
            client.last_seen = time.monotonic()

    def charge(self, client_id: str, usage: Usage) -> Client:
        """Charge ``usage`` to an attached client while serving, for memory held outside the
        core's tables (shared segments); ``QuotaExceeded`` past its tenant's quotas."""
        with self._t.lock:
            self._t.state.check_serving()
            client = self._t.clients.get(client_id)
            self._t.ledger.charge(client, usage)
        return client

    def refund(self, client: Client, usage: Usage) -> None:
        """Give back what ``charge`` took."""
        self._t.ledger.refund(client, usage)

    # Catalog ----------------------------------------------------------------

    @property
    def catalog(self) -> CatalogView:
        """The catalog new loads see (sessions keep the pipeline they were loaded with)."""
        return self._catalogs.current

    @property
    def catalog_generation(self) -> int:
        """How many times the catalog was replaced (a door's kept lookups go when it moves)."""
        return self._catalogs.generation

    def replace_catalog(self, catalog: CatalogView) -> CatalogChange:
        """*Blocking*: serve ``catalog`` once its kernels are made on every device's backend
        (``CatalogError`` naming the first that is not; the old catalog stays)."""
        return self._catalogs.replace(catalog, self._t.backends.values())

    def reload_catalog(self) -> CatalogChange:
        """*Blocking*: ``replace_catalog`` with the catalog read again from its folders."""
        return self._catalogs.reload(self._t.backends.values())

    def remove_pipeline(self, target: str) -> CatalogChange:
        """*Blocking*: stop serving every version of ``target`` until the next reload."""
        return self._catalogs.without(target, self._t.backends.values())

    def pipelines(self) -> tuple[Pipeline, ...]:
        return self.catalog.pipelines

    def formats_of(self, pipeline: Pipeline) -> tuple[ArtifactFormat, ...]:
        return self.catalog.formats_of(pipeline)

    def backend_formats(self) -> tuple[ArtifactFormat, ...]:
        return tuple(f for f in ArtifactFormat if f in self.backend.formats)

    # Sessions and launches -----------------------------------------------------

    def load_pipeline(
        self,
        client_id: str,
        target: str,
        version: int = 0,
        format: ArtifactFormat | None = None,
        device: int | None = None,
        lowered: int = 0,
    ) -> LoadedSession:
        """*Blocking* (compiles): the client's session for this key, made if it has none.

        Each load counts: the session is freed by the release that matches the last
        one, so two parts of one client that load the same pipeline cannot free it
        under each other. ``device`` ``None``: the client's home device. ``lowered``:
        its stream that many priority levels below its tenant's (a session of its own).
        """
        session, created = self._holdings.load(
            self.catalog, client_id, target, version, format, device, lowered
        )
        if created:
            log.info(
                "session loaded",
                client_id=client_id,
                session_id=session.id,
                target=session.pipeline.target,
                version=session.pipeline.version,
                format=session.key.format.value,
                device=session.key.device,
            )
        return LoadedSession(
            session.id, created, session.pipeline, session.key.format, session.key.device
        )

    def session_scalars(self, client_id: str, session_id: str) -> tuple[ScalarSpec, ...]:
        """The runtime scalars a client's session takes, in order (a ring binds them once)."""
        with self._t.lock:
            return self._t.session(client_id, session_id)[1].pipeline.runtime_scalars

    def pipeline_of(self, client_id: str, session_id: str) -> str:
        """The catalog target of a client's session, or ``unknown`` (a bounded metrics label)."""
        with self._t.lock:
            try:
                return self._t.session(client_id, session_id)[1].pipeline.target
            except AccyError:
                return UNKNOWN_PIPELINE

    def release(self, client_id: str, session_id: str) -> None:
        """*Blocking*: release one load; the last frees the session after its work."""
        self._holdings.release(client_id, session_id)

    async def release_async(self, client_id: str, session_id: str) -> None:
        """``release``, awaiting the session's work on the event loop."""
        await self._holdings.release_async(client_id, session_id)

    def allocate_intermediates(
        self, client_id: str, session_id: str, scalars: Mapping[str, Scalar]
    ) -> int:
        """*Blocking*: give the session scratch for these scalars (kept if large enough)."""
        t = self._t
        with t.lock:
            t.state.check_serving()
            client, session = t.session(client_id, session_id)
            args = order_scalars(session.pipeline, scalars)
            session.pipeline.validate_runtime_scalars(args)
            needed = intermediate_byte_sizes(session.pipeline, args)
            current = session.scratch
            if current is not None and all(
                b.byte_size >= n for b, n in zip(current.buffers, needed, strict=True)
            ):
                return current.byte_size
        with t.ledger.reserve(client, Usage(memory_bytes=sum(needed))) as held:
            with t.state.guard(session.id, session.backend):
                scratch = allocate_intermediates(session.backend, session.pipeline, args)
            held.undo(scratch.close)
            with t.lock:
                t.check_attached(client)
                if client.session(session.id) is not session:
                    raise NotFound(f"no session {session_id!r}", field="session_id")
                old, session.scratch = session.scratch, scratch  # its tickets are revoked
                if old is not None:
                    t.ledger.refund(client, Usage(memory_bytes=old.byte_size))
                tail = session.pending(None)
                held.keep()
        if old is not None:  # launches enqueued before the swap may still use it
            try:
                self._holdings.wait(tail, session)
            finally:
                if tail is not None:
                    tail.release()
                old.close()
        elif tail is not None:
            tail.release()
        return scratch.byte_size

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
    ) -> LaunchTicket:
        """Check, then enqueue on the session's stream; returns at once (``Launching.launch``).

        A launch that needs scratch of its own raises ``WouldBlock`` (nothing done) with
        the rest of it as ``finish``, for the door to run off its thread; ``may_block``
        runs that here instead, for *blocking* callers (the one-call path, tests).
        """
        try:
            return self._launching.launch(
                client_id,
                session_id,
                operands,
                results,
                scalars,
                watch=watch,
                ticket_for=ticket_for,
            )
        except WouldBlock as blocked:
            if not may_block:
                raise
            return blocked.finish()

    def wait_launch(
        self, client_id: str, session_id: str, launch_id: str | None = None, *, reap: bool = True
    ) -> None:
        """*Blocking*: wait for one launch of the session, or all so far (``reap``: see
        ``Holdings.wait_launch``)."""
        self._holdings.wait_launch(client_id, session_id, launch_id, reap=reap)

    async def wait_launch_async(
        self, client_id: str, session_id: str, launch_id: str | None = None
    ) -> None:
        """``wait_launch``, awaiting the launch's end on the event loop."""
        await self._holdings.wait_launch_async(client_id, session_id, launch_id)

    def reap(self, client_id: str, session_id: str) -> bool:
        """Drop a session's finished launches and refund them; whether some still run."""
        return self._holdings.reap(client_id, session_id)

    # Buffers ----------------------------------------------------------------

    def allocate_buffer(
        self,
        client_id: str,
        byte_size: int,
        dtype: DType | None = None,
        device: int | None = None,
        *,
        exportable: bool = False,
    ) -> BufferRecord:
        """*Blocking*: a zeroed buffer charged to the client's tenant (``Holdings``)."""
        return self._holdings.allocate_buffer(
            client_id, byte_size, dtype, device, exportable=exportable
        )

    def check_buffer(self, client_id: str, buffer_id: str) -> None:
        """``NotFound`` unless the client owns the buffer."""
        with self._t.lock:
            self._t.clients.get(client_id).buffer(buffer_id)

    def open_write(self, client_id: str, buffer_id: str) -> Transfer:
        """A streamed write, ordered after the buffer's readers and last writer."""
        return self._holdings.open_transfer(client_id, buffer_id, writing=True)

    def open_read(self, client_id: str, buffer_id: str) -> Transfer:
        """A streamed read, ordered after the buffer's last writer."""
        return self._holdings.open_transfer(client_id, buffer_id, writing=False)

    def free_buffer(self, client_id: str, buffer_id: str) -> None:
        """*Blocking*: wait for the work that uses the buffer, then free it."""
        self._holdings.free_buffer(client_id, buffer_id)

    async def free_buffer_async(self, client_id: str, buffer_id: str) -> None:
        """``free_buffer``, awaiting the buffer's users on the event loop."""
        await self._holdings.free_buffer_async(client_id, buffer_id)

    # Detach, devices ----------------------------------------------------------

    def detach(self, client_id: str) -> None:
        """*Blocking*: close the client's extensions, then free everything it owns once its
        running work finished."""
        for extension in self._extensions:
            extension.close_client(client_id)
        self._holdings.detach(client_id)

    async def detach_async(self, client_id: str) -> None:
        """``detach``, awaiting the client's running work on the event loop."""
        for extension in self._extensions:
            await asyncio.to_thread(extension.close_client, client_id)
        await self._holdings.detach_async(client_id)

    def replace_device(self, device: int, backend: Backend) -> None:
        """*Blocking*: ``backend`` serves isolated ``device`` from now on (``Replacing``);
        then each extension hears of it."""
        self._replacing.replace_device(device, backend)
        for extension in self._extensions:
            extension.device_replaced(device, backend)

    def split_sms(
        self, specs: Sequence[PartitionSpec], placements: Mapping[str, Placement]
    ) -> None:
        """*Blocking*, at start: each device's SMs split into ``specs``' partitions, and each
        tenant's partition and priority (``core/partitions.py``)."""
        self._t.partitions.configure(specs, placements)
        for device, backend in sorted(self._t.backends.items()):
            self._t.partitions.split(device, backend)

    def place_tenants(
        self, specs: Sequence[PartitionSpec], placements: Mapping[str, Placement]
    ) -> None:
        """Tenants' partitions and priorities anew (a reloaded tokens file), for new
        sessions; partitions other than those made at start are only logged."""
        self._t.partitions.place_tenants(placements, specs)

    def whole_device(self, tenant: str) -> bool:
        """Whether ``tenant``'s sessions run on the whole device (no SM partition)."""
        return self._t.partitions.placement(tenant).partition is None

    # One call and status ----------------------------------------------------

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
    ) -> list[Tensor]:
        """*Blocking*: upload, launch, wait, download (``accyd.core.run``)."""
        return run(
            self,
            client_id,
            target,
            version,
            format,
            operands,
            scalars,
            tenant=tenant,
            quotas=quotas,
        )

    def status(
        self, client_id: str | None = None, tenants: Collection[str] | None = None
    ) -> DaemonStatus:
        """The daemon's numbers; ``tenants`` limits the per-tenant part (``None``: all)."""
        return status_of(
            self._t,
            self.instance_id,
            time.monotonic() - self._started_at,
            (self.launches_total, self.launches_failed),
            client_id,
            tenants,
        )

    def close(self) -> None:
        """*Blocking*: detach every client (after its work), then close the backends."""
        self.begin_drain()
        for client in self._t.clients:
            self.detach(client.id)
        for backend in self._t.backends.values():
            backend.close()


if TYPE_CHECKING:

    def _fits(daemon: Daemon) -> Core:
        """The type checker's proof that ``Daemon`` is a ``Core``."""
        return daemon
