"""The server's lifecycle: start, serve, drain, stop; it wires config, backends, daemon and service.

Shutdown is ordered: health NOT_SERVING, no new work, no new calls, the device work and
calls in flight drained within the grace, Attach streams ended, every client's resources
released, the backends closed. Calls still running when the grace ends are answered
UNAVAILABLE (reason ``SHUTTING_DOWN``); if the device is still busy then, its work not yet
done is dropped with the process, which exits ``EXIT_STOPPED_BUSY``. A device fault skips
the release (the context is poisoned) and exits non-zero so the process is restarted.
``accyd.serving`` runs one as the ``accyd serve`` process, under its signals.

Every call but health and reflection passes the admission interceptor
(``accyd.doors.grpc.admission``); TCP listeners serve TLS when a certificate is
configured; metrics are served on a port of their own when asked for.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import structlog
from grpc_reflection.v1alpha import reflection  # type: ignore[import-untyped, unused-ignore]

from accyd.backends.base import Backend
from accyd.backends.queues import MAX_CONNECTIONS_ENV
from accyd.backends.worker.front.pool import DevicePool
from accyd.catalog import load_catalog
from accyd.core.catalogs import check_kernels
from accyd.core.daemon import CatalogView, Daemon
from accyd.core.limits import daemon_limits, raise_descriptor_limit
from accyd.devices import open_backends, replace_device
from accyd.doors.grpc.admission import Admission, AdmissionInterceptor
from accyd.doors.grpc.auth import Authenticator, default_principal
from accyd.doors.grpc.calls import CallTracker
from accyd.doors.grpc.health import Health
from accyd.doors.grpc.servicer import SERVICE_NAME, LaunchServicer
from accyd.doors.grpc.tls import server_credentials
from accyd.doors.hostmem import Segments
from accyd.doors.kserve.servicer import SERVICE_NAME as KSERVE_SERVICE
from accyd.doors.kserve.servicer import KServeServicer
from accyd.errors import AccyError, DeviceFault, ShuttingDown, Unavailable
from accyd.logs import flush_left_out
from accyd.process.event_loop import set_loop_spin
from accyd.process.exits import EXIT_DEVICE_LOST as EXIT_DEVICE_FAULT
from accyd.process.exits import EXIT_STOPPED_BUSY, Lineage
from accyd.process.malloc import keep_freed_memory
from accyd.process.socket_claim import SocketClaim, umask
from accyd.process.steps import alive, on_loop, within
from accyd.ring import RingDoor
from accyd.ring.doors import RingDoors
from accyd.scheduling import DeviceWork
from accyd.settings.config import Config
from accyd.telemetry.metrics import Metrics, RingLaunchCounts
from accyd.tokens import TokenTable

if TYPE_CHECKING:
    from accyd.doors.kserve_http.door import KServeHttpDoor

__all__ = ["EXIT_DEVICE_FAULT", "Server"]

SUPERVISOR_POLL_SECONDS = 0.5

log = structlog.get_logger("accyd.server")


class Server:
    """One daemon process's server: made from a ``Config``, then ``start``, ``wait``, ``stop``."""

    def __init__(
        self,
        config: Config,
        *,
        backends: Mapping[int, Backend] | None = None,
        catalog: CatalogView | None = None,
        lineage: Lineage | None = None,
    ) -> None:
        self.config = config
        self._backends = dict(backends) if backends is not None else None
        self._catalog = catalog
        self.lineage = Lineage.from_env() if lineage is None else lineage
        pid = self.lineage.supervisor_pid
        # Judged now, at start: the supervisor may die (or be a shell that exits once the
        # socket appears) before serving begins, and its pid is then no proof either way.
        self._supervised = pid is not None and (os.getppid() == pid or not alive(pid))
        self.addresses: list[str] = []
        self._loop_spin = 0.0
        self._malloc_tuned = False
        self.metrics = Metrics()
        self.metrics_port: int | None = None
        self._watching: asyncio.Task[None] | None = None
        self.exit_code = 0
        self._claims: list[SocketClaim] = []
        self.rings: RingDoor | None = None
        self.ring_doors: RingDoors | None = None
        """The rings' engine and doors (shared rings and rings over a stream)."""
        self._pool: DevicePool | None = None
        """The device worker processes, when each device runs in one of its own."""
        self._health_grpc: grpc.aio.Server | None = None
        self.health_address: str | None = None
        """Where the health-only listener is (``--health-listen``), once serving."""
        self.kserve: KServeServicer | None = None  # --kserve
        self.kserve_http: KServeHttpDoor | None = None  # --kserve-http-listen
        self._stop_requested: asyncio.Event | None = None
        self._reloads: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._stopped = False
        self._calls_ended: int | None = None  # by the stop itself, once it ended them

    async def start(self) -> None:
        """Open the devices, make the daemon and every door whole, listen, then serve: the
        steps below, in this order (a listener that cannot open closes what came before)."""
        loop = asyncio.get_running_loop()
        self._stop_requested = asyncio.Event()
        descriptors = raise_descriptor_limit()  # a daemon of many clients wants them all
        tokens = self._load_tokens()
        credentials = server_credentials(self.config)
        backends = self._open_backends()
        catalog = self._catalog or self._catalog_source()
        self._tune_process(loop, backends)
        self.daemon = self._make_daemon(catalog, backends)
        made = await self._ready_daemon(catalog, backends, descriptors, tokens)
        self._make_doors(backends)
        self._grpc = self._make_grpc_server(tokens)
        self._listen(credentials, backends)
        await self._grpc.start()
        await self._open_beside()
        await self.health.set_serving(True)
        if self.supervised:
            self._watching = loop.create_task(self._watch_supervisor())
        self._log_serving(catalog, made, tokens, tls=credentials is not None)

    def _load_tokens(self) -> TokenTable | None:
        path = self.config.tokens_file
        return None if path is None else TokenTable.load(path)

    def _catalog_source(self) -> CatalogView:
        return load_catalog(self.config.catalog_dirs, builtin=self.config.builtin_catalog)

    def _open_backends(self) -> Mapping[int, Backend]:
        """The given backends, or each configured device's (in a worker process of its own
        when the config says so: a fault then replaces that device alone)."""
        if self._backends is not None:
            return self._backends
        backends, self._pool = open_backends(
            self.config, lambda device, fault: self.daemon.device_lost(device, fault)
        )
        return backends

    def _tune_process(
        self, loop: asyncio.AbstractEventLoop, backends: Mapping[int, Backend]
    ) -> None:
        """Keep freed memory for reuse, and spin the event loop as the devices want."""
        kinds = {backend.kind.value for backend in backends.values()}
        self._malloc_tuned = keep_freed_memory(self.config.malloc_keep_bytes)
        spin = self.config.loop_spin_for(kinds.pop() if len(kinds) == 1 else "mixed")
        self._loop_spin = spin if set_loop_spin(loop, spin) else 0.0

    def _make_daemon(self, catalog: CatalogView, backends: Mapping[int, Backend]) -> Daemon:
        loop = asyncio.get_running_loop()

        def on_fault(fault: DeviceFault) -> None:  # from any thread
            if fault.isolated:  # on a thread of its own: replace that device alone
                self._replace_device(fault)
            elif on_loop(loop):  # at once, before the faulting call's reply goes out
                self._on_fault(fault)
            else:
                loop.call_soon_threadsafe(self._on_fault, fault)

        config = self.config
        return Daemon(
            catalog,
            backends,
            quotas=config.quotas,
            on_fault=on_fault,
            on_quota_refused=self.metrics.quota_refused,
            isolated=self._backends is None and config.uses_device_workers,
            catalog_source=None if self._catalog else self._catalog_source,
        )

    async def _ready_daemon(
        self,
        catalog: CatalogView,
        backends: Mapping[int, Backend],
        descriptors: int,
        tokens: TokenTable | None,
    ) -> int:
        """Every kernel made for the devices before the first client (a broken one stops the
        start naming its file and line, and the compile cache is warm for the first loads),
        the daemon's limits, its tenants' SM partitions, its metrics; the kernels made."""
        daemon, metrics = self.daemon, self.metrics
        made = await asyncio.to_thread(check_kernels, backends.values(), catalog.registry)
        daemon.set_limits(daemon_limits(self.config.shared_memory_limit, descriptors))
        if tokens is not None:  # SM partitions and stream priorities, made once here
            await asyncio.to_thread(daemon.split_sms, tokens.partitions, tokens.placements)
        metrics.watch(daemon.status)
        metrics.restarts.set(self.lineage.restarts)
        metrics.device_faults.inc(self.lineage.device_faults)
        return made

    def _make_doors(self, backends: Mapping[int, Backend]) -> None:
        """The device-work threads and every door over the daemon, each made whole: the rings
        (their engine; their door and the shared memory beside the first Unix socket), the
        launch service, the KServe door, health."""
        config, daemon, metrics = self.config, self.daemon, self.metrics
        self.work = DeviceWork(config.blocking_threads, tenant_of=self._tenant_of_client)
        self.calls = CallTracker(self.work)
        ring_counts = RingLaunchCounts(metrics, daemon.pipeline_of)
        if not config.no_rings:
            host = any(backend.kind.value == "host" for backend in backends.values())
            self.ring_doors = RingDoors(
                daemon,
                self.work,
                kind=None if config.engine == "auto" else config.engine,  # type: ignore[arg-type]
                threads=config.engine_threads,
                crowd_threads=config.crowd_engine_threads,
                # Spinning takes the GIL the host backend's kernels need: on a device only.
                spin_seconds=0.0 if host else config.launch_spin_seconds,
                observer=ring_counts,
                wait_budget=config.wait_budget,
                engine_timings=config.engine_timings,
                device_launch=config.device_launch,  # type: ignore[arg-type]
            )
            engine = self.ring_doors.engine
            metrics.watch_launcher(lambda: engine.stats().get("device_launcher") or {})
        socket = _first_unix_socket(config.listen_addresses)
        if self.ring_doors is not None and socket is not None:
            self.rings, self._segments = self.ring_doors.open_door(socket)
        else:  # no rings, or no Unix socket to hand memory over beside: no memory shared
            self._segments = Segments(daemon, None)
        daemon.extend(self._segments)
        self.servicer = LaunchServicer(
            daemon,
            self.calls,
            segments=self._segments,
            tenant=config.default_tenant,
            heartbeat_seconds=config.heartbeat_seconds,
            read_chunk_bytes=config.read_chunk_bytes,
            launch_spin_seconds=config.launch_spin_seconds,
            max_chunk_bytes=config.max_message_bytes - 1024,
            quotas=config.quotas,
            metrics=metrics,
            lineage=self.lineage,
            rings=self.rings,
            ring_streams=None if self.ring_doors is None else self.ring_doors.streams,
            ring_counts=ring_counts,
        )
        if config.kserve:  # the KServe v2 door, admitted as the launch service is
            self.kserve = KServeServicer.from_config(daemon, self.calls, config, metrics)
        self.health = Health([SERVICE_NAME, *([KSERVE_SERVICE] if self.kserve is not None else [])])

    def _make_grpc_server(self, tokens: TokenTable | None) -> grpc.aio.Server:
        """The gRPC server with its services, every call but health's and reflection's
        admitted first (``accyd.doors.grpc.admission``)."""
        config = self.config
        self._authenticator = Authenticator(
            tokens,
            default_principal(config.default_tenant, config.quotas),
            unix_trusted=config.unix_trusted,
            tenant_of_client=self._tenant_of_client,
        )
        self._admission = Admission(self._authenticator)
        server = grpc.aio.server(
            interceptors=[AdmissionInterceptor(self._admission)],
            options=config.grpc_server_options(),
        )
        self.servicer.register(server)
        services = [SERVICE_NAME]
        if self.kserve is not None:
            self.kserve.register(server)
            services.append(KSERVE_SERVICE)
        self.health.register(server)
        reflection.enable_server_reflection(
            (*services, "grpc.health.v1.Health", reflection.SERVICE_NAME), server
        )
        return server

    def _listen(
        self, credentials: grpc.ServerCredentials | None, backends: Mapping[int, Backend]
    ) -> None:
        """Bind every listener and the metrics port; if one cannot, close what start opened."""
        try:
            for address in self.config.listen_addresses:
                self.addresses.append(self._bind(address, credentials))
            if self.config.metrics_port is not None:
                self.metrics_port = self.metrics.serve(
                    self.config.metrics_port, self.config.metrics_address
                )
        except BaseException:
            self._release_sockets()
            self.metrics.close()
            self.work.close(wait=False)
            if self._pool is not None:
                self._pool.close()
            elif self._backends is None:
                for backend in backends.values():
                    backend.close()
            raise

    async def _open_beside(self) -> None:
        """Once gRPC serves: its sockets handed over, the rings' handoff socket and engine
        started, the health-only listener and the KServe HTTP door opened (when asked for)."""
        config = self.config
        for claim in self._claims:
            claim.bound()
        if self.ring_doors is not None:
            self.ring_doors.start()
        if config.health_listen:
            self._health_grpc, self.health_address = await self.health.serve_alone(
                config.health_listen
            )
        if self.kserve is not None and config.kserve_http_listen:
            from accyd.doors.kserve_http.door import serve_http  # aiohttp: only when asked for

            self.kserve_http = await serve_http(self.kserve, self._admission, config)

    def _log_serving(
        self, catalog: CatalogView, made: int, tokens: TokenTable | None, *, tls: bool
    ) -> None:
        config, backend = self.config, self.daemon.backend
        engine = None if self.ring_doors is None else self.ring_doors.engine
        log.info(
            "accyd serving",
            backend=backend.kind.value,
            requested_backend=config.backend,
            device=backend.device_name,
            listen=self.addresses,
            rings=None if self.rings is None else str(self.rings.path),
            engine=None if engine is None else engine.kind,
            engine_threads=None if engine is None else engine.threads,
            instance_id=self.daemon.instance_id,
            pipelines=len(catalog.pipelines),
            kernels_made=made,
            pid=os.getpid(),
            tls=tls,
            mutual_tls=config.tls_client_ca is not None,
            tokens=None if tokens is None else len(tokens),
            unix_trusted=config.unix_trusted,
            metrics_port=self.metrics_port,
            health_listen=self.health_address,
            kserve_http=None if self.kserve_http is None else self.kserve_http.addresses,
            loop_spin_us=round(self._loop_spin * 1e6),
            malloc_keep_bytes=config.malloc_keep_bytes if self._malloc_tuned else None,
            cuda_max_connections=os.environ.get(MAX_CONNECTIONS_ENV),
            restarts=self.lineage.restarts,
        )

    @property
    def supervised(self) -> bool:
        """Whether a supervisor started this process (it may have died since)."""
        return self._supervised

    def _tenant_of_client(self, client_id: str) -> str | None:
        try:
            return self.daemon.client(client_id).tenant.name
        except AccyError:
            return None

    async def _watch_supervisor(self) -> None:
        """Stop (gracefully) once the supervisor that started this process is gone."""
        while os.getppid() == self.lineage.supervisor_pid:
            await asyncio.sleep(SUPERVISOR_POLL_SECONDS)
        self.request_stop("supervisor gone")

    def _bind(self, address: str, credentials: grpc.ServerCredentials | None) -> str:
        if address.startswith("unix:"):
            path = _socket_path(address)
            claim = SocketClaim(path)
            claim.take()
            self._claims.append(claim)
            with umask(0o117):
                self._grpc.add_insecure_port(f"unix:{path}")
            return f"unix:{path}"
        refusal = self.config.tcp_refusal(address)
        if refusal:
            raise Unavailable(refusal)
        if credentials is None:
            port = self._grpc.add_insecure_port(address)
        else:
            port = self._grpc.add_secure_port(address, credentials)
        if port == 0:
            raise Unavailable(f"cannot listen on {address}")
        host = address.rsplit(":", 1)[0]
        return f"{host}:{port}"

    def _release_sockets(self) -> None:
        for claim in self._claims:
            claim.release()

    def _replace_device(self, fault: DeviceFault) -> None:
        replace_device(self._pool, self.daemon, self.metrics, fault)

    def _on_fault(self, fault: DeviceFault) -> None:
        log.error("device lost; exiting so the daemon restarts", session_id=fault.session)
        self.metrics.device_faults.inc()
        self.exit_code = EXIT_DEVICE_FAULT
        asyncio.get_running_loop().create_task(self.health.set_serving(False))
        self.request_stop("device fault")

    def reload(self) -> None:
        """SIGHUP: the tokens file now, the catalog on a thread (each one that does not load
        changes nothing)."""
        self.reload_tokens()
        task = asyncio.get_running_loop().create_task(self.reload_catalog())
        self._reloads.add(task)
        task.add_done_callback(self._reloads.discard)

    async def reload_catalog(self) -> None:
        """Read the catalog folders again and serve them once every kernel is made; a broken
        manifest or kernel is logged and the old catalog stays."""
        try:
            change = await asyncio.to_thread(self.daemon.reload_catalog)
        except AccyError as error:
            log.error("catalog not reloaded; the old catalog stays", error=error.message)
            return
        log.info(
            "catalog reloaded",
            added=list(change.added),
            replaced=list(change.replaced),
            removed=list(change.removed),
        )

    def reload_tokens(self) -> None:
        """Read the tokens file again (SIGHUP; one that does not load changes nothing): the
        calls in flight it no longer admits end at once (streams too; an Attach's end detaches
        its client), as do the KServe clients of tenants it no longer names; a tenant's new
        quotas apply from its next Attach."""
        path = self.config.tokens_file
        if path is None:
            log.info("no tokens file to reload")
            return
        try:
            tokens = TokenTable.load(path)
        except AccyError as error:
            log.error("tokens file not reloaded; the old tokens stay", error=str(error))
            return
        named = set(tokens.tenant_quotas)
        self._authenticator.replace_tokens(tokens)
        self.daemon.place_tenants(tokens.partitions, tokens.placements)
        ended = self._admission.revoke()
        dropped = 0 if self.kserve is None else self.kserve.drop_tenants_but(named)
        log.info(
            "tokens file reloaded",
            tokens=len(tokens),
            path=str(path),
            calls_ended=ended,
            kserve_clients_dropped=dropped,
        )

    def _end_calls(self) -> None:
        """Answer every admitted call still running: the daemon is shutting down (once)."""
        if self._calls_ended is None:
            self._calls_ended = self._admission.in_flight.end_all(_SHUTTING_DOWN)
            if self._calls_ended:
                log.info("calls ended at the deadline", calls=self._calls_ended)

    def request_stop(self, reason: str) -> None:
        """Begin the ordered shutdown (from the event loop's thread)."""
        log.info("stop requested", reason=reason)
        if self._stop_requested is not None:
            self._stop_requested.set()

    async def wait(self) -> int:
        """Serve until a stop is requested, then stop; returns the exit status."""
        assert self._stop_requested is not None, "start() first"
        await self._stop_requested.wait()
        await self.stop()
        return self.exit_code

    async def stop(self) -> None:
        """Drain within the grace, release everything, close the backends; idempotent."""
        if self._stopping:
            return
        self._stopping = True
        # Polling is for serving: a stopping daemon sleeps between events, so the gRPC
        # threads that finish the shutdown never wait for the GIL behind a spinning loop.
        set_loop_spin(asyncio.get_running_loop(), 0.0)
        if self._watching is not None:
            self._watching.cancel()
        faulted = self.daemon.fault is not None
        grace = self.config.fault_grace_seconds if faulted else self.config.grace_seconds
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        await self.health.set_serving(False)
        self.daemon.begin_drain()
        if self.kserve is not None:  # its idle streams end now, busy ones once answered
            self.kserve.begin_drain()
        # Calls running at the deadline are answered then (SHUTTING_DOWN); gRPC cancels the
        # rest (health, reflection) once they are, however late a loaded loop runs them.
        stopping = asyncio.create_task(
            self._grpc.stop(grace if faulted else grace + STOP_SLACK_SECONDS)
        )
        ending = loop.call_at(deadline, self._end_calls)
        rest = self._admission.in_flight.cancel_rest(self._grpc, deadline + ABANDON_SECONDS)
        cancelling = asyncio.create_task(rest)
        http = self.kserve_http  # its requests in flight drain as the gRPC calls do
        http_stopping = asyncio.create_task(http.close()) if http is not None else None
        await asyncio.sleep(0)  # the listeners close: hand the socket paths over now
        self._release_sockets()
        busy = False
        if not faulted:
            # Not on the device-work threads: waiting calls may hold every one of them.
            idle = await asyncio.to_thread(self.daemon.wait_idle, grace)
            calls_done = await self.calls.wait_idle(deadline - loop.time())
            # Each ring's last launches reach it (their ends written where the client
            # waits) before the Attach streams end: a client that sees its stream end
            # first counts what it still waits for as lost.
            rings_settled = self.ring_doors is None or (
                idle
                and await self.ring_doors.wait_settled(max(deadline - loop.time(), ABANDON_SECONDS))
            )
            busy = not idle
            if not calls_done:
                self._end_calls()
            log.info(
                "drained",
                device_idle=idle,
                calls_done=calls_done,
                calls_ended=self._calls_ended or 0,
                rings_settled=rings_settled,
            )
        self.servicer.close_attach_streams()
        # Bounded: a stop that hangs must not keep a faulted daemon from exiting (its
        # successor cannot start before it does), nor a drained one from stopping.
        await within(stopping, grace + STOP_SLACK_SECONDS, "gRPC server stop")
        ending.cancel()
        cancelling.cancel()
        if http_stopping is not None:
            await within(http_stopping, grace + STOP_SLACK_SECONDS, "KServe HTTP door stop")
        abandon = faulted or busy  # what the device still runs is dropped with the process
        detach_within = ABANDON_SECONDS if abandon else STOP_SLACK_SECONDS
        await within(self.servicer.wait_detached(), detach_within, "client detach")
        if self.kserve is not None:  # its callers' clients, regions and buffers
            await within(self.kserve.close(), detach_within, "kserve client detach")
        if self.ring_doors is not None:
            await self.ring_doors.close()
        if self._health_grpc is not None:  # it said NOT_SERVING since the drain began
            await self._health_grpc.stop(0)
        await asyncio.to_thread(self._segments.close_all)
        if not abandon:
            await self.work.run(self.daemon.close)
        elif busy:
            log.warning("device still busy after the grace; dropping its work", grace=grace)
            self.exit_code = self.exit_code or EXIT_STOPPED_BUSY
        self.work.close(wait=not abandon, drop_queued=True)
        if self._pool is not None:  # every worker process ends, spares too
            await asyncio.to_thread(self._pool.close)
        # The metrics server takes up to half a second to stop: not worth waiting for after
        # a device fault, since the process exits at once.
        closing = threading.Thread(target=self.metrics.close, name="accyd-metrics-close")
        closing.start()
        if not abandon:
            await asyncio.to_thread(closing.join)
        self._stopped = True
        flush_left_out()
        log.info("accyd stopped", exit_code=self.exit_code)


def _socket_path(address: str) -> Path:
    """The path of a ``unix:`` listen address."""
    return Path(address.removeprefix("unix:")).expanduser()


def _first_unix_socket(addresses: Sequence[str]) -> Path | None:
    """The first Unix socket listened on: the rings' and shared memory's handoff socket is
    made beside it."""
    return next((_socket_path(a) for a in addresses if a.startswith("unix:")), None)


STOP_SLACK_SECONDS = 5.0
"""How long past its grace a stop step may take before the server goes on without it."""
ABANDON_SECONDS = 0.5
"""How long a stop that drops the device's work gives the detaches (they wait for it), and
how long past the grace gRPC lets the calls it does not admit run."""
_SHUTTING_DOWN = ShuttingDown(
    "the daemon is shutting down and its grace ran out before this call finished; "
    "retry against its successor"
)
