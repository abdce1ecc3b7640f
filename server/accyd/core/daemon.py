"""The daemon's state: catalog, backends, clients, sessions and buffers, as plain methods.

Methods marked *blocking* wait on the device (or compile) and must run off
the event loop; the others only enqueue and return at once. Every method is
safe from any thread: tables change under one lock, never held across a wait.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

from accyd.backends.base import Backend, Stream
from accyd.catalog.dtypes import DType, Scalar
from accyd.catalog.model import ArtifactFormat, Pipeline, Registry, ScalarSpec
from accyd.core.buffers import BufferRecord, Transfer
from accyd.core.clients import Client, ClientTable
from accyd.core.executor import (
    allocate_intermediates,
    intermediate_byte_sizes,
    load_pipeline_artifacts,
)
from accyd.core.ids import BUFFER, CLIENT, INSTANCE, SESSION, new_id
from accyd.core.marks import Mark, MarkWatch, order_after
from accyd.core.sessions import Session, SessionKey, order_scalars
from accyd.core.tenants import DEFAULT_TENANT, Quotas, Tenant, Usage
from accyd.errors import (
    AccyError,
    DeviceFault,
    InvalidRequest,
    LaunchArgumentMismatch,
    NotFound,
    Unavailable,
    UnsupportedOperation,
)

__all__ = [
    "CatalogView",
    "Daemon",
    "DaemonStatus",
    "LaunchTicket",
    "LoadedSession",
    "TenantStatus",
    "Tensor",
]

log = structlog.get_logger("accyd.core")


class CatalogView(Protocol):
    """What the daemon needs of the catalog (``accyd.catalog.Catalog`` fits)."""

    @property
    def registry(self) -> Registry: ...

    @property
    def pipelines(self) -> tuple[Pipeline, ...]: ...

    def find_pipeline(self, target: str, version: int = 0) -> Pipeline: ...

    def formats_of(self, pipeline: Pipeline) -> tuple[ArtifactFormat, ...]: ...


@dataclass(frozen=True, slots=True)
class LoadedSession:
    session_id: str
    created: bool
    pipeline: Pipeline
    format: ArtifactFormat


MAX_BUFFER_BYTES = 1 << 40
"""No buffer is larger (1 TiB): a sanity bound before any quota, so no request asks the
backend to allocate and zero absurd sizes."""


@dataclass(frozen=True, slots=True)
class LaunchTicket:
    """An enqueued launch; ``must_wait`` when it runs on scratch made for it alone."""

    session_id: str
    launch_id: str
    must_wait: bool
    pipeline: str
    """The catalog target the session runs: a bounded label for metrics."""
    watch: MarkWatch | None = None
    """For a launch made with ``watch=True``: the caller's hold on its end (it closes it)."""


@dataclass(frozen=True, slots=True)
class Tensor:
    """Inline data of the one-call path: little-endian elements, packed."""

    name: str
    dtype: DType | None
    data: bytes


@dataclass(frozen=True, slots=True)
class DaemonStatus:
    instance_id: str
    backend: str
    device_name: str
    serving: bool
    uptime_seconds: float
    clients: int
    sessions: int
    buffers: int
    device_memory_in_use: int
    launches_total: int
    launches_failed: int
    my_sessions: int = 0
    my_buffers: int = 0
    my_memory_in_use: int = 0
    tenants: tuple[TenantStatus, ...] = ()
    """Every tenant's usage, or only those asked for (``status(tenants=...)``)."""
    quota_refusals: int = 0
    """Calls refused by a quota since start, over every tenant."""


@dataclass(frozen=True, slots=True)
class TenantStatus:
    """One tenant's quotas, what it holds now, and its refusals by quota name."""

    name: str
    clients: int
    quotas: Quotas
    usage: Usage
    quota_refusals: Mapping[str, int]


class Daemon:
    """Every operation the service needs, over the clients' sessions and buffers."""

    def __init__(
        self,
        catalog: CatalogView,
        backends: Mapping[int, Backend],
        *,
        quotas: Quotas | None = None,
        tenant_quotas: Mapping[str, Quotas] | None = None,
        on_fault: Callable[[DeviceFault], None] | None = None,
        on_quota_refused: Callable[[str, str], None] | None = None,
    ) -> None:
        if not backends:
            raise ValueError("the daemon needs at least one device")
        self.catalog = catalog
        self.backends = dict(backends)
        self.instance_id = new_id(INSTANCE, 9)
        self.started_at = time.monotonic()
        self.launches_total = 0
        self.launches_failed = 0
        self._quotas = quotas or Quotas()
        self._tenant_quotas = dict(tenant_quotas or {})
        self._tenants: dict[str, Tenant] = {}
        self._clients = ClientTable()
        self._lock = threading.RLock()
        self._draining = False
        self._fault: DeviceFault | None = None
        self._on_fault = on_fault
        self._on_quota_refused = on_quota_refused
        self._refusals: dict[tuple[str, str], int] = {}

    # State ------------------------------------------------------------------

    @property
    def backend(self) -> Backend:
        """The first device's backend (what status and the formats list describe)."""
        return self.backends[min(self.backends)]

    @property
    def serving(self) -> bool:
        return not self._draining and self._fault is None

    @property
    def fault(self) -> DeviceFault | None:
        return self._fault

    def begin_drain(self) -> None:
        """Refuse new work from now on (``Unavailable``); reads, waits and frees still work.

        Idempotent: ``close`` calls it too, after a server that began the drain.
        """
        with self._lock:
            first, self._draining = not self._draining, True
        if first:
            log.info("draining")

    def _check_alive(self) -> None:
        if self._fault is not None:
            raise DeviceFault(
                f"the device was lost ({self._fault.message}); reattach once the daemon restarts",
                session=self._fault.session,
            )

    def _check_serving(self) -> None:
        self._check_alive()
        if self._draining:
            raise Unavailable("the daemon is shutting down; retry against its successor")

    @contextlib.contextmanager
    def _device(self, session_id: str | None = None) -> Iterator[None]:
        """Note a device fault (the process must restart) before it propagates."""
        try:
            yield
        except DeviceFault as fault:
            noted = DeviceFault(fault.message, session=fault.session or session_id)
            with self._lock:
                first, self._fault = self._fault is None, self._fault or noted
                origin = self._fault
            if first:
                log.error("device fault", session_id=noted.session, error=noted.message)
                if self._on_fault is not None:
                    self._on_fault(noted)
            # Every caller learns which session's work lost the device, the first one too.
            raise DeviceFault(origin.message, session=origin.session) from fault

    def _tenant(self, name: str) -> Tenant:
        tenant = self._tenants.get(name)
        if tenant is None:
            quotas = self._tenant_quotas.get(name, self._quotas)
            tenant = self._tenants[name] = Tenant(name, quotas, on_refused=self._refused)
        return tenant

    def _refused(self, tenant: Tenant, quota: str) -> None:
        """Count a quota refusal (called under the lock, before ``QuotaExceeded`` is raised)."""
        key = (tenant.name, quota)
        self._refusals[key] = self._refusals.get(key, 0) + 1
        if self._on_quota_refused is not None:
            self._on_quota_refused(tenant.name, quota)

    def _backend(self, device: int) -> Backend:
        backend = self.backends.get(device)
        if backend is None:
            raise NotFound(
                f"no device {device}; this daemon serves {sorted(self.backends)}", field="device"
            )
        return backend

    def _session(self, client_id: str, session_id: str) -> tuple[Client, Session]:
        client = self._clients.get(client_id)
        return client, client.session(session_id)

    # Clients ----------------------------------------------------------------

    def attach(
        self, name: str = "", tenant: str = DEFAULT_TENANT, quotas: Quotas | None = None
    ) -> Client:
        """A new client of ``tenant``; ``quotas`` (from its credentials) replace the tenant's."""
        with self._lock:
            self._check_serving()
            owner = self._tenant(tenant)
            if quotas is not None:
                owner.quotas = quotas
            client = Client(new_id(CLIENT), name, owner)
            self._clients.add(client)
        log.info("client attached", client_id=client.id, tenant=tenant, client_name=name)
        return client

    def client(self, client_id: str) -> Client:
        with self._lock:
            return self._clients.get(client_id)

    def detach(self, client_id: str) -> None:
        """*Blocking*: free everything the client owns once its queued work finished."""
        with self._lock:
            client = self._clients.pop(client_id)
            if client is None:
                return
            sessions = list(client.sessions.values())
            buffers = list(client.buffers.values())
            streams = dict(client.transfer_streams)
            client.sessions.clear()
            client.session_ids.clear()
            client.buffers.clear()
            client.transfer_streams.clear()
        for session in sessions:
            self._close_session(client, session)
        for record in buffers:
            self._free(client, record)
        for device, stream in streams.items():
            backend = self.backends[device]
            with contextlib.suppress(AccyError), self._device():
                backend.synchronize(stream)
            backend.destroy_stream(stream)
        log.info(
            "client detached", client_id=client.id, sessions=len(sessions), buffers=len(buffers)
        )

    # Catalog ----------------------------------------------------------------

    def pipelines(self) -> tuple[Pipeline, ...]:
        return self.catalog.pipelines

    def formats_of(self, pipeline: Pipeline) -> tuple[ArtifactFormat, ...]:
        return self.catalog.formats_of(pipeline)

    def backend_formats(self) -> tuple[ArtifactFormat, ...]:
        return tuple(f for f in ArtifactFormat if f in self.backend.formats)

    def _pick_format(
        self, pipeline: Pipeline, backend: Backend, wanted: ArtifactFormat | None
    ) -> ArtifactFormat:
        available = self.catalog.formats_of(pipeline)
        loadable = [f for f in available if f in backend.formats]
        if wanted is None and loadable:
            return loadable[0]
        if wanted is not None and wanted in loadable:
            return wanted
        has = ", ".join(f.value for f in available)
        loads = ", ".join(sorted(f.value for f in backend.formats))
        which = "" if wanted is None else f" as {wanted.value}"
        raise UnsupportedOperation(
            f"{pipeline.target} cannot run{which} here: it exists as {has}; "
            f"the {backend.kind.value} backend loads {loads}",
            field="format",
        )

    # Sessions ---------------------------------------------------------------

    def load_pipeline(
        self,
        client_id: str,
        target: str,
        version: int = 0,
        format: ArtifactFormat | None = None,
        device: int = 0,
    ) -> LoadedSession:
        """*Blocking* (compiles): the client's session for this key, made if it has none.

        Each load counts: the session is freed by the release that matches the last
        one, so two parts of one client that load the same pipeline cannot free it
        under each other.
        """
        if not target:
            raise InvalidRequest("target is empty", field="target")
        pipeline = self.catalog.find_pipeline(target, version)
        backend = self._backend(device)
        fmt = self._pick_format(pipeline, backend, format)
        key = SessionKey(pipeline.target, pipeline.version, fmt, device)
        with self._lock:
            self._check_serving()
            client = self._clients.get(client_id)
            existing = client.session_for(key)
            if existing is not None:
                existing.loads += 1
                return LoadedSession(existing.id, False, pipeline, fmt)
            client.tenant.charge(Usage(sessions=1))
        try:
            with self._device():
                pool = load_pipeline_artifacts(backend, pipeline, self.catalog.registry, fmt)
                try:
                    stream = backend.create_stream()
                except BaseException:
                    pool.close()
                    raise
        except BaseException:
            with self._lock:
                client.tenant.refund(Usage(sessions=1))
            raise
        session = Session(
            new_id(SESSION), key, pipeline, self.catalog.registry, backend, pool, stream
        )
        with self._lock:
            attached = self._clients.find(client_id) is client
            other = client.session_for(key)
            if attached and other is None:
                client.add_session(session)
            else:
                client.tenant.refund(Usage(sessions=1))
                if other is not None:
                    other.loads += 1
        if not attached or other is not None:
            session.close()
            if other is None:
                raise NotFound(f"client {client_id!r} detached", field="client_id")
            return LoadedSession(other.id, False, pipeline, fmt)
        log.info(
            "session loaded",
            client_id=client_id,
            session_id=session.id,
            target=pipeline.target,
            version=pipeline.version,
            format=fmt.value,
        )
        return LoadedSession(session.id, True, pipeline, fmt)

    def allocate_intermediates(
        self, client_id: str, session_id: str, scalars: Mapping[str, Scalar]
    ) -> int:
        """*Blocking*: give the session scratch for these scalars (kept if large enough)."""
        with self._lock:
            self._check_serving()
            client, session = self._session(client_id, session_id)
            args = order_scalars(session.pipeline, scalars)
            session.pipeline.validate_runtime_scalars(args)
            needed = intermediate_byte_sizes(session.pipeline, args)
            current = session.scratch
            if current is not None and all(
                b.byte_size >= n for b, n in zip(current.buffers, needed, strict=True)
            ):
                return current.byte_size
            charge = Usage(memory_bytes=sum(needed))
            client.tenant.charge(charge)
        try:
            with self._device(session.id):
                scratch = allocate_intermediates(session.backend, session.pipeline, args)
        except BaseException:
            with self._lock:
                client.tenant.refund(charge)
            raise
        with self._lock:
            live = client.sessions.get(session.id) is session
            if live:
                old, session.scratch = session.scratch, scratch
                if old is not None:
                    client.tenant.refund(Usage(memory_bytes=old.byte_size))
                tail = session.pending(None)
            else:
                client.tenant.refund(charge)
        if not live:
            scratch.close()
            raise NotFound(f"no session {session_id!r}", field="session_id")
        if old is not None:  # launches enqueued before the swap may still use it
            self._wait(tail, session.id)
            old.close()
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
    ) -> LaunchTicket:
        """Validate, then enqueue on the session's stream; returns at once.

        With ``watch``, the ticket holds a ``MarkWatch`` (unless the launch runs on
        scratch of its own, ``must_wait``), so the caller can learn of its end
        without blocking a thread; the caller closes it.
        """
        with self._lock, self._counted():
            self._check_serving()
            client, session = self._session(client_id, session_id)
            _check_counts(session.pipeline, len(operands), len(results))
            args = order_scalars(session.pipeline, scalars)
            ops = self._launch_buffers(client, session, "operands", operands)
            res = self._launch_buffers(client, session, "results", results)
            reaped = session.reap(free_scratch=False)
            client.tenant.refund(Usage(launches_in_flight=reaped.launches))
            scratch = session.scratch_for(args)
            transient_bytes = 0
            if scratch is None and session.needs_scratch:
                session.pipeline.validate_runtime_scalars(args)
                transient_bytes = sum(intermediate_byte_sizes(session.pipeline, args))
            charge = Usage(memory_bytes=transient_bytes, launches_in_flight=1)
            client.tenant.charge(charge)
            before = session.next_seq
            try:
                with self._device(session.id):
                    transient = (
                        allocate_intermediates(session.backend, session.pipeline, args)
                        if transient_bytes
                        else None
                    )
                    order_after(session.backend, session.stream, _hazards(ops, res))
                    record = session.enqueue(
                        [r.buffer for r in ops], [r.buffer for r in res], args, transient
                    )
            except BaseException:
                parked = session.newest(before)
                if parked is None:
                    client.tenant.refund(charge)
                else:
                    _note(parked.mark, ops, res)
                raise
            _note(record.mark, ops, res)
            return LaunchTicket(
                session.id,
                session.launch_id(record.seq),
                transient is not None,
                session.pipeline.target,
                MarkWatch(record.mark, session.stream) if watch and transient is None else None,
            )

    @contextlib.contextmanager
    def _counted(self) -> Iterator[None]:
        try:
            yield
        except AccyError:
            self.launches_failed += 1
            raise
        self.launches_total += 1

    @staticmethod
    def _launch_buffers(
        client: Client, session: Session, role: str, ids: Sequence[str]
    ) -> list[BufferRecord]:
        records = []
        for index, buffer_id in enumerate(ids):
            field = f"{role}[{index}]"
            record = client.buffer(buffer_id, field)
            if record.device != session.key.device:
                raise LaunchArgumentMismatch(
                    f"buffer {buffer_id} is on device {record.device}; session {session.id} "
                    f"runs on device {session.key.device}",
                    field=field,
                )
            records.append(record)
        return records

    def session_scalars(self, client_id: str, session_id: str) -> tuple[ScalarSpec, ...]:
        """The runtime scalars a client's session takes, in order (a ring binds them once)."""
        with self._lock:
            return self._session(client_id, session_id)[1].pipeline.runtime_scalars

    def check_buffer(self, client_id: str, buffer_id: str) -> None:
        """``NotFound`` unless the client owns the buffer."""
        with self._lock:
            self._clients.get(client_id).buffer(buffer_id)

    def touch(self, client_id: str) -> None:
        """The client is alive (a ring's records count as calls for liveness)."""
        client = self._clients.find(client_id)
        if client is not None:
            client.last_seen = time.monotonic()

    def pipeline_of(self, client_id: str, session_id: str) -> str:
        """The catalog target of a client's session, or ``unknown`` (a bounded metrics label)."""
        with self._lock:
            try:
                return self._session(client_id, session_id)[1].pipeline.target
            except AccyError:
                return "unknown"

    def wait_launch(
        self, client_id: str, session_id: str, launch_id: str | None = None, *, reap: bool = True
    ) -> None:
        """*Blocking*: wait for one launch of the session, or for all so far.

        With ``reap`` false, finished launches stay in the session's log until
        ``reap`` (or the session's next launch or wait) drops them: for a caller
        that answers first and tidies after.
        """
        with self._lock:
            self._check_alive()
            client, session = self._session(client_id, session_id)
            seq = session.launch_seq(launch_id) if launch_id else None
            mark = session.pending(seq)
        self._wait(mark, session.id)
        if reap:
            self._reap(client, session)

    def reap(self, client_id: str, session_id: str) -> None:
        """Drop a session's finished launches from its log and give their quota back.

        Scratch made for one launch alone is freed here (which may block); a
        session released or a client detached meanwhile has nothing left to drop.
        Tidying only, it raises nothing: a lost device is reported by the next call.
        """
        with self._lock:
            try:
                client, session = self._session(client_id, session_id)
            except AccyError:
                return
        with contextlib.suppress(AccyError):
            self._reap(client, session)

    def _reap(self, client: Client, session: Session) -> None:
        with self._lock:
            reaped = session.reap(free_scratch=True)
            client.tenant.refund(
                Usage(memory_bytes=reaped.scratch_bytes, launches_in_flight=reaped.launches)
            )
        reaped.close()

    def _wait(self, mark: Mark | None, session_id: str) -> None:
        if mark is None:
            return
        try:
            with self._device(session_id):
                mark.wait()
        finally:
            mark.release()

    def release(self, client_id: str, session_id: str) -> None:
        """*Blocking*: release one load; the last waits for the session's work, then frees
        its pool, scratch and stream (an earlier one returns at once)."""
        with self._lock:
            client = self._clients.get(client_id)
            session = client.session(session_id)
            session.loads -= 1
            if session.loads > 0:
                log.info("session load released", session_id=session_id, loads=session.loads)
                return
            client.pop_session(session_id)
        self._close_session(client, session)
        log.info("session released", client_id=client_id, session_id=session_id)

    def _close_session(self, client: Client, session: Session) -> None:
        try:
            with self._device(session.id):
                session.backend.synchronize(session.stream)
        except AccyError as error:
            log.warning("session work failed", session_id=session.id, error=str(error))
        with self._lock:
            memory = session.scratch_bytes()
            drained = session.drain()
            client.tenant.refund(
                Usage(memory_bytes=memory, sessions=1, launches_in_flight=drained.launches)
            )
        drained.close()
        session.close()

    # Buffers ----------------------------------------------------------------

    def allocate_buffer(
        self, client_id: str, byte_size: int, dtype: DType | None = None, device: int = 0
    ) -> BufferRecord:
        """*Blocking* (the device may take a while): a buffer of ``byte_size`` bytes."""
        if not 0 < byte_size <= MAX_BUFFER_BYTES:
            raise InvalidRequest(
                f"byte_size must be 1..{MAX_BUFFER_BYTES}, not {byte_size}", field="byte_size"
            )
        if dtype is not None and byte_size % dtype.itemsize:
            raise InvalidRequest(
                f"byte_size {byte_size} is no whole number of {dtype.value} elements",
                field="byte_size",
            )
        backend = self._backend(device)
        charge = Usage(memory_bytes=byte_size, buffers=1)
        with self._lock:
            self._check_serving()
            client = self._clients.get(client_id)
            client.tenant.charge(charge)
        try:
            with self._device():
                buffer = backend.allocate_buffer(
                    byte_size,
                    zero=True,  # memory is reused between clients: never show old data
                    dtype=dtype,
                    element_count=None if dtype is None else byte_size // dtype.itemsize,
                )
        except BaseException:
            with self._lock:
                client.tenant.refund(charge)
            raise
        record = BufferRecord(new_id(BUFFER), device, buffer, dtype)
        with self._lock:
            attached = self._clients.find(client_id) is client
            if attached:
                client.buffers[record.id] = record
            else:
                client.tenant.refund(charge)
        if not attached:
            backend.destroy(buffer)
            raise NotFound(f"client {client_id!r} detached", field="client_id")
        return record

    def open_write(self, client_id: str, buffer_id: str) -> Transfer:
        """A streamed write, ordered after the buffer's readers and last writer."""
        return self._open(client_id, buffer_id, writing=True)

    def open_read(self, client_id: str, buffer_id: str) -> Transfer:
        """A streamed read, ordered after the buffer's last writer."""
        return self._open(client_id, buffer_id, writing=False)

    def _open(self, client_id: str, buffer_id: str, *, writing: bool) -> Transfer:
        with self._lock:
            if writing:
                self._check_serving()
            else:
                self._check_alive()
            client = self._clients.get(client_id)
            record = client.buffer(buffer_id)
            backend = self.backends[record.device]
            stream = self._transfer_stream(client, record.device)
            hazards = record.write_hazards() if writing else record.read_hazards()
            with self._device():
                order_after(backend, stream, hazards)
        return Transfer(backend, record, stream, self._lock, writing=writing)

    def _transfer_stream(self, client: Client, device: int) -> Stream:
        stream = client.transfer_streams.get(device)
        if stream is None:
            with self._device():
                stream = client.transfer_streams[device] = self.backends[device].create_stream()
        return stream

    def free_buffer(self, client_id: str, buffer_id: str) -> None:
        """*Blocking*: wait for the work that uses the buffer, then free it."""
        with self._lock:
            client = self._clients.get(client_id)
            record = client.buffer(buffer_id)
            del client.buffers[buffer_id]
        self._free(client, record)

    def _free(self, client: Client, record: BufferRecord) -> None:
        with record.lock:
            record.closed = True
        with self._lock:
            marks = record.take_marks()
        try:
            for mark in marks:
                with contextlib.suppress(AccyError):
                    mark.wait()
        finally:
            for mark in marks:
                mark.release()
        self.backends[record.device].destroy(record.buffer)
        with self._lock:
            client.tenant.refund(Usage(memory_bytes=record.byte_size, buffers=1))

    # One call ---------------------------------------------------------------

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
        """*Blocking*: upload, launch, wait, download.

        A caller that did not attach gets a client of its own for the call, of its
        ``tenant`` and under its ``quotas``, so the one-call path bypasses no quota.
        """
        anonymous = client_id is None
        owner = self.attach("run", tenant, quotas).id if client_id is None else client_id
        try:
            loaded = self.load_pipeline(owner, target, version, format)
            pipeline = loaded.pipeline
            _check_tensors(pipeline, operands)
            args = order_scalars(pipeline, scalars)
            pipeline.validate_runtime_scalars(args)
            for index, (spec, tensor) in enumerate(zip(pipeline.operands, operands, strict=True)):
                # Refused before anything is allocated, as Launch would refuse it.
                spec.check_holds(len(tensor.data), spec.byte_size(args), "operand", index)
            sizes = [spec.byte_size(args) for spec in pipeline.results]
            made: list[BufferRecord] = []
            try:
                for spec, tensor in zip(pipeline.operands, operands, strict=True):
                    made.append(self.allocate_buffer(owner, len(tensor.data), spec.dtype))
                    with self.open_write(owner, made[-1].id) as transfer:
                        transfer.write(0, tensor.data)
                for spec, size in zip(pipeline.results, sizes, strict=True):
                    made.append(self.allocate_buffer(owner, size, spec.dtype))
                ids = [record.id for record in made]
                count = len(operands)
                ticket = self.launch(owner, loaded.session_id, ids[:count], ids[count:], scalars)
                self.wait_launch(owner, loaded.session_id, ticket.launch_id)
                outputs = zip(pipeline.results, made[count:], sizes, strict=True)
                return [
                    Tensor(spec.name, spec.dtype, self.open_read(owner, record.id).read(0, size))
                    for spec, record, size in outputs
                ]
            finally:
                for record in made:
                    with contextlib.suppress(NotFound):
                        self.free_buffer(owner, record.id)
        finally:
            if anonymous:
                self.detach(owner)

    # Status and lifecycle ---------------------------------------------------

    def status(
        self, client_id: str | None = None, tenants: Collection[str] | None = None
    ) -> DaemonStatus:
        """The daemon's numbers; ``tenants`` limits the per-tenant part (``None``: all)."""
        with self._lock:
            clients = list(self._clients)
            mine = self._clients.find(client_id) if client_id else None
            backend = self.backend
            shown = [t for t in self._tenants.values() if tenants is None or t.name in tenants]
            return DaemonStatus(
                instance_id=self.instance_id,
                backend=backend.kind.value,
                device_name=backend.device_name,
                serving=self.serving,
                uptime_seconds=time.monotonic() - self.started_at,
                clients=len(clients),
                sessions=sum(len(c.sessions) for c in clients),
                buffers=sum(len(c.buffers) for c in clients),
                device_memory_in_use=sum(b.memory_in_use() for b in self.backends.values()),
                launches_total=self.launches_total,
                launches_failed=self.launches_failed,
                my_sessions=0 if mine is None else len(mine.sessions),
                my_buffers=0 if mine is None else len(mine.buffers),
                my_memory_in_use=0 if mine is None else mine.memory_in_use(),
                tenants=tuple(self._tenant_status(t, clients) for t in shown),
                quota_refusals=sum(self._refusals.values()),
            )

    def _tenant_status(self, tenant: Tenant, clients: Sequence[Client]) -> TenantStatus:
        return TenantStatus(
            name=tenant.name,
            clients=sum(1 for c in clients if c.tenant is tenant),
            quotas=tenant.quotas,
            usage=dataclasses.replace(tenant.usage),
            quota_refusals={q: n for (t, q), n in self._refusals.items() if t == tenant.name},
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


def _hazards(operands: Sequence[BufferRecord], results: Sequence[BufferRecord]) -> list[Mark]:
    marks = [mark for record in operands for mark in record.read_hazards()]
    return marks + [mark for record in results for mark in record.write_hazards()]


def _note(mark: Mark, operands: Sequence[BufferRecord], results: Sequence[BufferRecord]) -> None:
    written = {id(record) for record in results}
    for record in operands:
        if id(record) not in written:
            record.note_read(mark)
    for record in results:
        record.note_write(mark)


def _check_counts(pipeline: Pipeline, operands: int, results: int | None = None) -> None:
    for role, given, specs in (
        ("operands", operands, pipeline.operands),
        ("results", results, pipeline.results),
    ):
        if given is not None and given != len(specs):
            raise LaunchArgumentMismatch(
                f"{pipeline.target} takes {len(specs)} {role}; got {given}", field=role
            )


def _check_tensors(pipeline: Pipeline, operands: Sequence[Tensor]) -> None:
    _check_counts(pipeline, len(operands))
    for index, (spec, tensor) in enumerate(zip(pipeline.operands, operands, strict=True)):
        where = f"operands[{index}]"
        if tensor.name and tensor.name != spec.name:
            raise LaunchArgumentMismatch(
                f"operand {index} is {spec.name!r}, not {tensor.name!r}", field=f"{where}.name"
            )
        if tensor.dtype is not None and tensor.dtype is not spec.dtype:
            raise LaunchArgumentMismatch(
                f"operand {spec.name!r} is {spec.dtype.value}, not {tensor.dtype.value}",
                field=f"{where}.dtype",
            )
        if not tensor.data or len(tensor.data) % spec.dtype.itemsize:
            raise InvalidRequest(
                f"operand {spec.name!r} needs a positive whole number of {spec.dtype.value} "
                f"elements; got {len(tensor.data)} bytes",
                field=f"{where}.data",
            )
