"""The core facade: every operation a front door may call, over clients, sessions and buffers.

Operations take and return plain data (ids, numbers, dataclasses). Those marked
*blocking* may wait for the device or compile, and run off the event loop; the
``*_async`` ones await the device's completions on the event loop and park no
thread; the rest only enqueue and return. Tables change under one lock, which
is never held across a device allocation or a wait.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import structlog

from accyd.backends.base import Backend
from accyd.catalog.dtypes import Scalar
from accyd.catalog.model import ArtifactFormat, Pipeline, ScalarSpec
from accyd.core.accounting import DEFAULT_LAUNCHES_PER_CLIENT, Ledger
from accyd.core.arguments import Tensor
from accyd.core.buffers import Transfer
from accyd.core.clients import Client, ClientTable
from accyd.core.device import DeviceState
from accyd.core.executor import (
    allocate_intermediates,
    intermediate_byte_sizes,
)
from accyd.core.holdings import CatalogView, WouldBlock
from accyd.core.ids import CLIENT, INSTANCE, new_id
from accyd.core.launching import Launching, LaunchTicket
from accyd.core.marks import MarkWatch
from accyd.core.placement import load_of
from accyd.core.run import run
from accyd.core.sessions import order_scalars
from accyd.core.status import DaemonStatus, DeviceStatus, TenantStatus
from accyd.core.tenants import DEFAULT_TENANT, Quotas, Usage
from accyd.errors import AccyError, DeviceFault, NotFound

__all__ = [
    "UNKNOWN_PIPELINE",
    "CatalogView",
    "Daemon",
    "DaemonStatus",
    "LaunchTicket",
    "LoadedSession",
    "TenantStatus",
    "Tensor",
    "WouldBlock",
]

UNKNOWN_PIPELINE = "unknown"
"""What ``pipeline_of`` says of a session it does not know (a bounded metrics label)."""

log = structlog.get_logger("accyd.core")


@dataclass(frozen=True, slots=True)
class LoadedSession:
    session_id: str
    created: bool
    pipeline: Pipeline
    format: ArtifactFormat
    device: int


class Daemon(Launching):
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
    ) -> None:
        """``isolated``: each backend runs in a process of its own, so a fault on one device
        is that device's alone (``on_fault`` then replaces it: ``replace_device``)."""
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
        state = DeviceState(lock, table, on_fault, isolated=isolated)
        super().__init__(table, lock, ledger, state, ClientTable())
        self.catalog = catalog
        self.instance_id = new_id(INSTANCE, 9)
        self.started_at = time.monotonic()
        self.launches_total = 0
        self.launches_failed = 0

    # State ------------------------------------------------------------------

    @property
    def backend(self) -> Backend:
        """The first device's backend (what status and the formats list describe)."""
        return self.backends[min(self.backends)]

    @property
    def serving(self) -> bool:
        return self._state.serving

    @property
    def fault(self) -> DeviceFault | None:
        return self._state.fault

    def device_lost(self, device: int, fault: DeviceFault) -> None:
        """Isolated ``device`` was lost outside any call (its worker process died): latch it,
        which has it replaced (``on_fault``)."""
        self._state.device_lost(device, fault)

    def begin_drain(self) -> None:
        """Refuse new work from now on (``Unavailable``); reads, waits and frees still work."""
        self._state.begin_drain()

    # Clients ----------------------------------------------------------------

    def attach(
        self, name: str = "", tenant: str = DEFAULT_TENANT, quotas: Quotas | None = None
    ) -> Client:
        """A new client of ``tenant``; ``quotas`` (from its credentials) replace the tenant's."""
        with self._lock:
            self._state.check_serving()
            owner = self._ledger.tenant(tenant)
            if quotas is not None:
                owner.quotas = quotas
            client = Client(new_id(CLIENT), name, owner)
            self._clients.add(client)
        log.info("client attached", client_id=client.id, tenant=tenant, client_name=name)
        return client

    def client(self, client_id: str) -> Client:
        with self._lock:
            return self._clients.get(client_id)

    def charge(self, client_id: str, usage: Usage) -> Client:
        """Charge ``usage`` to an attached client while serving, for memory held outside the
        core's tables (shared segments); ``QuotaExceeded`` past its tenant's quotas."""
        with self._lock:
            self._state.check_serving()
            client = self._clients.get(client_id)
            self._ledger.charge(client, usage)
        return client

    def refund(self, client: Client, usage: Usage) -> None:
        """Give back what ``charge`` took."""
        self._ledger.refund(client, usage)

    # Catalog ----------------------------------------------------------------

    def pipelines(self) -> tuple[Pipeline, ...]:
        return self.catalog.pipelines

    def formats_of(self, pipeline: Pipeline) -> tuple[ArtifactFormat, ...]:
        return self.catalog.formats_of(pipeline)

    def backend_formats(self) -> tuple[ArtifactFormat, ...]:
        return tuple(f for f in ArtifactFormat if f in self.backend.formats)

    def session_scalars(self, client_id: str, session_id: str) -> tuple[ScalarSpec, ...]:
        """The runtime scalars a client's session takes, in order (a ring binds them once)."""
        with self._lock:
            return self._session(client_id, session_id)[1].pipeline.runtime_scalars

    def check_buffer(self, client_id: str, buffer_id: str) -> None:
        """``NotFound`` unless the client owns the buffer."""
        with self._lock:
            self._clients.get(client_id).buffer(buffer_id)

    def newest_launch(self, client_id: str, session_id: str) -> MarkWatch | None:
        """A hold on the end of the session's newest launch (``None``: none in flight)."""
        with self._lock:
            try:
                session = self._session(client_id, session_id)[1]
            except AccyError:
                return None
            mark = session.pending(None)
            if mark is None:
                return None
            try:
                return MarkWatch(mark, session.stream)
            finally:
                mark.release()

    def launch_outcome(self, session_id: str, watch: MarkWatch) -> None:
        """Raise what a finished launch of the session failed with; a device fault is
        noted (the daemon stops serving) as every other front door's wait notes it."""
        with self._state.guard(session_id, watch.backend):
            watch.outcome()

    def frees_of(self, client_id: str) -> int:
        """How many buffers the client has freed: a ring drops its bound launches when this
        moves, so none keeps a freed buffer alive (-1: no such client)."""
        client = self._clients.find(client_id)
        return -1 if client is None else client.frees

    def touch(self, client_id: str) -> None:
        """The client is alive: a ring's records count as calls for liveness."""
        client = self._clients.find(client_id)
        if client is not None:
            client.last_seen = time.monotonic()

    def pipeline_of(self, client_id: str, session_id: str) -> str:
        """The catalog target of a client's session, or ``unknown`` (a bounded metrics label)."""
        with self._lock:
            try:
                return self._session(client_id, session_id)[1].pipeline.target
            except AccyError:
                return UNKNOWN_PIPELINE

    # Sessions ---------------------------------------------------------------

    def load_pipeline(
        self,
        client_id: str,
        target: str,
        version: int = 0,
        format: ArtifactFormat | None = None,
        device: int | None = None,
    ) -> LoadedSession:
        """*Blocking* (compiles): the client's session for this key, made if it has none.

        Each load counts: the session is freed by the release that matches the last
        one, so two parts of one client that load the same pipeline cannot free it
        under each other. ``device`` ``None``: the client's home device (``_place``).
        """
        session, created = self._load(self.catalog, client_id, target, version, format, device)
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

    def allocate_intermediates(
        self, client_id: str, session_id: str, scalars: Mapping[str, Scalar]
    ) -> int:
        """*Blocking*: give the session scratch for these scalars (kept if large enough)."""
        with self._lock:
            self._state.check_serving()
            client, session = self._session(client_id, session_id)
            args = order_scalars(session.pipeline, scalars)
            session.pipeline.validate_runtime_scalars(args)
            needed = intermediate_byte_sizes(session.pipeline, args)
            current = session.scratch
            if current is not None and all(
                b.byte_size >= n for b, n in zip(current.buffers, needed, strict=True)
            ):
                return current.byte_size
        with self._ledger.reserve(client, Usage(memory_bytes=sum(needed))) as held:
            with self._state.guard(session.id, session.backend):
                scratch = allocate_intermediates(session.backend, session.pipeline, args)
            held.undo(scratch.close)
            with self._lock:
                self._attached(client)
                if client.session(session.id) is not session:
                    raise NotFound(f"no session {session_id!r}", field="session_id")
                old, session.scratch = session.scratch, scratch
                if old is not None:
                    self._ledger.refund(client, Usage(memory_bytes=old.byte_size))
                tail = session.pending(None)
                held.keep()
        if old is not None:  # launches enqueued before the swap may still use it
            try:
                self._wait(tail, session)
            finally:
                old.close()
        return scratch.byte_size

    # Buffers ----------------------------------------------------------------

    def open_write(self, client_id: str, buffer_id: str) -> Transfer:
        """A streamed write, ordered after the buffer's readers and last writer."""
        return self._open(client_id, buffer_id, writing=True)

    def open_read(self, client_id: str, buffer_id: str) -> Transfer:
        """A streamed read, ordered after the buffer's last writer."""
        return self._open(client_id, buffer_id, writing=False)

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
        memory = {device: _memory_in_use(b) for device, b in list(self.backends.items())}
        with self._lock:
            clients = list(self._clients)
            leaving = list(self._leaving.values())
            mine = self._clients.find(client_id) if client_id else None
            backend = self.backend
            loads = load_of(self.backends, clients + leaving)
            ledger = self._ledger
            shown = [t for t in ledger.tenants.values() if tenants is None or t.name in tenants]
            return DaemonStatus(
                instance_id=self.instance_id,
                backend=backend.kind.value,
                device_name=backend.device_name,
                serving=self.serving,
                uptime_seconds=time.monotonic() - self.started_at,
                clients=len(clients),
                sessions=sum(len(c.sessions) for c in clients + leaving),
                buffers=sum(len(c.buffers) for c in clients + leaving),
                device_memory_in_use=sum(memory.values()),
                launches_total=self.launches_total,
                launches_failed=self.launches_failed,
                my_sessions=0 if mine is None else len(mine.sessions),
                my_buffers=0 if mine is None else len(mine.buffers),
                my_memory_in_use=0 if mine is None else mine.memory_in_use(),
                tenants=tuple(
                    TenantStatus(
                        name=t.name,
                        clients=sum(1 for c in clients if c.tenant is t),
                        quotas=t.quotas,
                        usage=ledger.usage_of(t),
                        quota_refusals=ledger.refusals_of(t.name),
                    )
                    for t in shown
                ),
                quota_refusals=sum(ledger.refusals.values()),
                detaching_clients=len(leaving),
                devices=tuple(
                    DeviceStatus(
                        index=device,
                        name=b.device_name,
                        backend=b.kind.value,
                        serving=self.serving and device not in self._state.lost,
                        clients=max(loads[device].clients, loads[device].homed),
                        sessions=loads[device].sessions,
                        buffers=loads[device].buffers,
                        memory_in_use=memory.get(device, 0),
                        launches_in_flight=loads[device].launches_in_flight,
                        replacements=self._state.replacements.get(device, 0),
                        isolated=self._state.isolated,
                    )
                    for device, b in sorted(self.backends.items())
                ),
            )

    def wait_idle(self, timeout: float) -> bool:
        """*Blocking*: wait up to ``timeout`` seconds for every launch so far; True if all done."""
        with self._lock:
            marks = [
                mark
                for client in self._clients
                for session in client.sessions.values()
                if (mark := session.pending(None)) is not None
            ]
        deadline = time.monotonic() + timeout
        try:
            while not all(mark.done() for mark in marks):
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.005)
            return True
        finally:
            for mark in marks:
                mark.release()

    def close(self) -> None:
        """*Blocking*: detach every client (after its work), then close the backends."""
        self.begin_drain()
        for client in self._clients:
            self.detach(client.id)
        for backend in self.backends.values():
            backend.close()


def _memory_in_use(backend: Backend) -> int:
    """What ``backend`` has allocated; 0 for one lost to a fault (its memory went with it)."""
    try:
        return backend.memory_in_use()
    except AccyError:
        return 0
