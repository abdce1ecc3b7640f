"""The server's lifecycle: start, serve, drain, stop; it wires config, backends, daemon and service.

Shutdown is ordered: health NOT_SERVING, no new work, no new calls, the
device work and calls in flight drained within the grace, Attach streams
ended, every client's resources released, the backends closed. A device
fault skips the release (the context is poisoned) and exits non-zero so the
process is restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import stat
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import structlog
from grpc_reflection.v1alpha import reflection  # type: ignore[import-untyped, unused-ignore]

from accyd.backends.base import Backend
from accyd.backends.select import make_backend
from accyd.catalog import load_catalog
from accyd.config import Config
from accyd.core.daemon import CatalogView, Daemon
from accyd.errors import DeviceFault, Unavailable
from accyd.service.calls import CallTracker
from accyd.service.health import Health
from accyd.service.servicer import SERVICE_NAME, LaunchServicer
from accyd.supervisor import EXIT_DEVICE_LOST as EXIT_DEVICE_FAULT

__all__ = ["EXIT_DEVICE_FAULT", "Server", "serve"]

EXIT_FORCED = 1

log = structlog.get_logger("accyd.server")


class Server:
    """One daemon process's server: made from a ``Config``, then ``start``, ``wait``, ``stop``."""

    def __init__(
        self,
        config: Config,
        *,
        backends: Mapping[int, Backend] | None = None,
        catalog: CatalogView | None = None,
    ) -> None:
        self.config = config
        self._backends = dict(backends) if backends is not None else None
        self._catalog = catalog
        self.addresses: list[str] = []
        self.exit_code = 0
        self._sockets: list[Path] = []
        self._stop_requested: asyncio.Event | None = None
        self._stopping = False
        self._stopped = False

    async def start(self) -> None:
        config = self.config
        loop = asyncio.get_running_loop()
        self._stop_requested = asyncio.Event()
        backends = self._backends or {
            device: make_backend(config.backend, device=device, cache_dir=config.cache_dir)
            for device in config.devices
        }
        catalog = self._catalog or load_catalog(config.catalog_dirs, builtin=config.builtin_catalog)

        def on_fault(fault: DeviceFault) -> None:  # from any thread
            loop.call_soon_threadsafe(self._on_fault, fault)

        self.daemon = Daemon(catalog, backends, quotas=config.quotas, on_fault=on_fault)
        self._executor = ThreadPoolExecutor(config.blocking_threads, "accyd-device")
        self.calls = CallTracker(self._executor)
        self.servicer = LaunchServicer(
            self.daemon,
            self.calls,
            tenant=config.default_tenant,
            heartbeat_seconds=config.heartbeat_seconds,
            read_chunk_bytes=config.read_chunk_bytes,
            max_chunk_bytes=config.max_message_bytes - 1024,
        )
        self.health = Health([SERVICE_NAME])
        self._grpc = grpc.aio.server(options=_options(config))
        self.servicer.register(self._grpc)
        self.health.register(self._grpc)
        reflection.enable_server_reflection(
            (SERVICE_NAME, "grpc.health.v1.Health", reflection.SERVICE_NAME), self._grpc
        )
        try:
            for address in config.listen_addresses:
                self.addresses.append(self._bind(address))
        except BaseException:
            self._executor.shutdown(wait=False)
            if self._backends is None:
                for backend in backends.values():
                    backend.close()
            raise
        await self._grpc.start()
        for path in self._sockets:
            os.chmod(path, 0o660)
        await self.health.set_serving(True)
        backend = self.daemon.backend
        log.info(
            "accyd serving",
            backend=backend.kind.value,
            requested_backend=config.backend,
            device=backend.device_name,
            listen=self.addresses,
            instance_id=self.daemon.instance_id,
            pid=os.getpid(),
        )

    def _bind(self, address: str) -> str:
        if address.startswith("unix:"):
            path = Path(address.removeprefix("unix:")).expanduser()
            _prepare_socket(path)
            with _umask(0o117):
                self._grpc.add_insecure_port(f"unix:{path}")
            self._sockets.append(path)
            return f"unix:{path}"
        if not self.config.insecure:
            raise Unavailable(
                f"refusing to serve {address} over TCP without credentials; "
                "pass --insecure to allow it on a trusted network"
            )
        port = self._grpc.add_insecure_port(address)
        if port == 0:
            raise Unavailable(f"cannot listen on {address}")
        host = address.rsplit(":", 1)[0]
        return f"{host}:{port}"

    def _on_fault(self, fault: DeviceFault) -> None:
        log.error("device lost; exiting so the daemon restarts", session_id=fault.session)
        self.exit_code = EXIT_DEVICE_FAULT
        asyncio.get_running_loop().create_task(self.health.set_serving(False))
        self.request_stop("device fault")

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
        faulted = self.daemon.fault is not None
        grace = self.config.fault_grace_seconds if faulted else self.config.grace_seconds
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        await self.health.set_serving(False)
        self.daemon.begin_drain()
        stopping = asyncio.create_task(self._grpc.stop(grace))
        if not faulted:
            idle = await self.calls.blocking(self.daemon.wait_idle, grace)
            calls_done = await self.calls.wait_idle(deadline - loop.time())
            log.info("drained", device_idle=idle, calls_done=calls_done)
        self.servicer.close_attach_streams()
        await stopping
        await self.servicer.wait_detached()
        if not faulted:
            await self.calls.blocking(self.daemon.close)
        self._executor.shutdown(wait=not faulted, cancel_futures=True)
        for path in self._sockets:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        self._stopped = True
        log.info("accyd stopped", exit_code=self.exit_code)


def _options(config: Config) -> list[tuple[str, int]]:
    keepalive_ms = int(config.keepalive_seconds * 1000)
    return [
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.keepalive_time_ms", keepalive_ms),
        ("grpc.keepalive_timeout_ms", int(config.keepalive_timeout_seconds * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.min_ping_interval_without_data_ms", min(keepalive_ms, 1000)),
        ("grpc.so_reuseport", 0),
    ]


def _prepare_socket(path: Path) -> None:
    """Make the socket's folder (0700) and take over a stale socket file; refuse a live one."""
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True)
    if not path.exists() and not path.is_symlink():
        return
    if not stat.S_ISSOCK(path.lstat().st_mode):
        raise Unavailable(f"{path} exists and is no socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()  # nobody listens: a stale socket of a dead daemon
    else:
        raise Unavailable(f"another daemon already listens on {path}")
    finally:
        probe.close()


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


async def serve(config: Config) -> int:
    """Run a server until SIGTERM or SIGINT (a second one forces exit); returns the exit status."""
    server = Server(config)
    loop = asyncio.get_running_loop()
    signals_seen = 0

    def on_signal(signum: signal.Signals) -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen > 1:
            log.warning("second signal; exiting now", signal=signum.name)
            os._exit(EXIT_FORCED)
        server.request_stop(signum.name)

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    await server.start()
    return await server.wait()
