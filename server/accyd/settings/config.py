"""Every daemon setting in one frozen dataclass; ``ACCYD_*`` environment variables override them."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accy.protocol import default_socket_path
from accyd.backends.host import DEFAULT_MEMORY_SHARE, physical_memory
from accyd.backends.queues import DEFAULT_QUEUES
from accyd.backends.select import BACKEND_CHOICES
from accyd.backends.worker.front.liveness import MIN_HANG_SECONDS
from accyd.core.tenants import DEFAULT_TENANT, Quotas
from accyd.settings.fields import (
    CATALOG_SEPARATOR,
    ENV_PREFIX,
    Bound,
    bool_text,
    choice,
    float_text,
    from_environment,
    index_pair,
    int_text,
    optional,
    path,
    seconds_from_us,
    setting,
    settings_of,
    size,
)
from accyd.settings.quotas import QUOTAS

__all__ = ["CUDA_LOOP_SPIN_SECONDS", "ENV_PREFIX", "QUOTAS", "SETTINGS", "Config", "memory_limit"]

CUDA_LOOP_SPIN_SECONDS = 500e-6
"""The event loop's polling on the CUDA backend unless set: docs/benchmarks.md has why."""
MiB = 1 << 20
_LEVELS = ("debug", "info", "warning", "error")


def memory_limit(raw: str) -> int:
    """A memory limit: a size (``8GiB``) or a share of physical memory (``50%``)."""
    text = raw.strip()
    if not text.endswith("%"):
        return size(text)
    share = float(text.removesuffix("%")) / 100
    if not 0 < share <= 1:
        raise ValueError("a share of physical memory is above 0% and at most 100%")
    return int(physical_memory() * share)


@dataclass(frozen=True, slots=True)
class Config:
    """What ``accyd serve`` runs with. Times are seconds, sizes bytes.

    Each field is a setting (``accyd.settings.fields``): a flag of ``accyd serve``, an
    ``ACCYD_<FIELD>`` environment variable and a default, declared here once.
    """

    listen: tuple[str, ...] = setting(
        (), "unix:/path or host:port (repeatable)", str, metavar="ADDR", separator=",",
        shown_default="a Unix socket in the per-user runtime folder",
    )  # fmt: skip
    backend: str = setting(
        "auto",
        "which backend runs kernels",
        choice(*BACKEND_CHOICES),
        metavar="|".join(BACKEND_CHOICES),
    )
    devices: tuple[int, ...] = setting(
        (0,),
        "a device to serve: its GPU ordinal (repeatable)",
        int_text,
        flag="--device",
        metavar="N",
        separator=",",
    )
    device_workers: bool | None = setting(
        None, "run each device's backend in a worker process of its own, with a warm spare: "
        "a sticky fault then costs that device's sessions and buffers only, and it serves "
        "again in a fraction of a second", optional(bool_text, "auto"), switch=True,
        shown_default="on with more than one --device",
    )  # fmt: skip
    """Device worker processes (``accyd.backends.worker``); ``None``: on with more than one
    device."""
    device_gpus: tuple[tuple[int, int], ...] = setting(
        (), "serve device INDEX on GPU ORDINAL (repeatable; needs device workers): devices "
        "sharing a GPU are fault domains of their own, a fault in one spares the others",
        index_pair, flag="--device-gpu", metavar="INDEX=ORDINAL", separator=",",
        shown_default="each device on the GPU of its own index",
    )  # fmt: skip
    catalog_dirs: tuple[Path, ...] = setting(
        (), "a catalog folder of manifests and kernels (repeatable)", path, flag="--catalog",
        metavar="DIR", separator=CATALOG_SEPARATOR,
    )  # fmt: skip
    builtin_catalog: bool = setting(
        True, "serve only the --catalog folders", bool_text, flag="--no-builtin-catalog",
        switch=True, switch_value=False,
    )  # fmt: skip
    cache_dir: Path | None = setting(None, "compiled kernel cache", optional(path), metavar="DIR")
    log_format: str = setting(
        "console", "json for machines", choice("console", "json"), metavar="console|json"
    )
    log_level: str = setting(
        "info", "the least level logged", choice(*_LEVELS), metavar="|".join(_LEVELS)
    )
    grace_seconds: float = setting(
        10.0, "drain time at shutdown; past it, the work not yet done is dropped",
        float_text, flag="--grace", metavar="SECONDS",
    )  # fmt: skip
    launch_spin_seconds: float = setting(
        100e-6, "poll a waited launch this long on the event loop before the driver calls "
        "back (0: off); the environment takes seconds", float_text, flag="--launch-spin-us",
        flag_parse=seconds_from_us, metavar="MICROSECONDS", shown_default="100 us",
    )  # fmt: skip
    """How long a waited launch is polled on the event loop before the driver calls back.

    A short launch then answers without a round trip through the driver's
    thread; a longer one costs the loop at most this much. 0 turns it off."""
    loop_spin_seconds: float | None = setting(
        None, "poll for calls this long before the event loop sleeps: lower latency for CPU "
        "time (auto: 500 us on cuda, off on host); the environment takes seconds",
        optional(float_text, "auto"), flag="--loop-spin-us",
        flag_parse=optional(seconds_from_us, "auto"), metavar="MICROSECONDS",
        shown_default="auto",
    )  # fmt: skip
    """How long the event loop polls before it sleeps (``accyd.process.event_loop``); ``None``: by
    backend, ``CUDA_LOOP_SPIN_SECONDS`` on CUDA (it takes about a fifth off a streamed
    launch's round trip) and off on the host, whose kernels need the CPU it would take."""
    host_memory_limit: int | None = setting(
        None, "the most buffer memory the host backend hands out: bytes (8GiB) or a share "
        "of physical memory (50%)", optional(memory_limit), metavar="SIZE",
        shown_default=f"{DEFAULT_MEMORY_SHARE:.0%} of physical memory",
    )  # fmt: skip
    shared_memory_limit: int | None = setting(
        None, "the most host memory the daemon shares with all its clients together (segments, "
        "rings): bytes (8GiB) or a share of physical memory (25%); each tenant may hold half "
        "of it unless its quota says", optional(memory_limit), metavar="SIZE",
        shown_default="25% of physical memory",
    )  # fmt: skip
    insecure: bool = setting(
        False, "allow TCP without TLS and without tokens (trusted networks only)", bool_text,
        group="security", switch=True,
    )  # fmt: skip
    """Serve TCP without TLS and without tokens: only when the operator asks for it by name."""
    tokens_file: Path | None = setting(
        None, "bearer tokens file (TOML: tenants with their quotas, token hashes with scopes); "
        "with it every call needs 'authorization: Bearer <token>' (health and reflection "
        "excepted); SIGHUP reloads it", optional(path), flag="--tokens", metavar="FILE",
        group="security",
    )  # fmt: skip
    """The bearer tokens file (``accyd.tokens``); with it every call needs a token."""
    kserve: bool = setting(
        True, "serve no KServe v2 / Open Inference Protocol door (inference.GRPCInferenceService, "
        "for tritonclient and perf_analyzer)", bool_text, flag="--no-kserve", switch=True,
        switch_value=False,
    )  # fmt: skip
    """Serve the KServe v2 door (``accyd.doors.kserve``) beside the launch service."""
    kserve_cuda_shared_memory: bool = setting(
        False, "KServe door: accept CUDA shared-memory regions from callers on this host (a "
        "CUDA IPC handle lets whoever sees it open the memory)", bool_text, switch=True,
        group="security",
    )  # fmt: skip
    kserve_liveness_seconds: float = setting(
        60.0, "KServe door: free a caller's sessions, buffers and shared-memory regions once it "
        "made no call this long (a closed loopback connection's at once)", float_text,
        metavar="SECONDS", group="tuning",
    )  # fmt: skip
    kserve_memory_limit: int | None = setting(
        None, "KServe door: the most daemon memory its requests' tensors and unsent answers "
        "hold at once, all callers together (more wait; a larger request is refused): bytes "
        "(1GiB) or a share of physical memory (5%)", optional(memory_limit), metavar="SIZE",
        shown_default="a quarter of --host-memory-limit, at most 4GiB", group="tuning",
    )  # fmt: skip
    kserve_http_listen: tuple[str, ...] = setting(
        (), "also serve the KServe v2 HTTP/REST door (for tritonclient.http, perf_analyzer -i "
        "http, curl) at host:port or unix:/path (repeatable); TCP needs TLS and tokens unless "
        "--insecure, as --listen does", str, metavar="ADDR", separator=",",
        shown_default="off",
    )  # fmt: skip
    """Where the KServe HTTP door listens (``accyd.doors.kserve_http``); empty: it is off."""
    no_rings: bool = setting(
        False, "hand out no same-host submission rings: local clients launch over gRPC",
        bool_text, switch=True,
    )  # fmt: skip
    engine: str = setting(
        "auto", "what takes the rings' records: native (C threads launch checked tickets), "
        "python (a Python loop checks every record), or auto (native where it is built)",
        choice("auto", "native", "python"), metavar="auto|native|python", group="tuning",
    )  # fmt: skip
    engine_threads: int = setting(
        0, "native engine threads, each taking a share of the rings (0: on a GPU four where "
        "this process may use 16 CPUs or more, two with 8 or more, else one)", int_text,
        metavar="N",
        group="tuning", shown_default="0 (auto)",
    )  # fmt: skip
    wait_budget: bool = setting(
        True, "tell no ring client how long to spin: each spins as its own CPU count says "
        "(up to 1 ms), even with more waiting clients than CPUs", bool_text,
        flag="--no-wait-budget", switch=True, switch_value=False, group="tuning",
    )  # fmt: skip
    """Publish each ring client's spin budget (``accyd.ring.waiting``)."""
    crowd_engine_threads: int = setting(
        0, "native engine threads once more ring clients wait than fit on the CPUs left "
        "(they then sleep), each serving its share of the rings; the --engine-threads "
        "serve them all otherwise (0: twice the automatic --engine-threads on a GPU, else "
        "--engine-threads)", int_text, metavar="N", group="tuning", shown_default="0 (auto)",
    )  # fmt: skip
    device_launch: str = setting(
        "off", "when the GPU itself launches the checked, ticketed launches of ring clients "
        "that wait for them (a resident launcher kernel; no daemon CPU on their path), for "
        "tenants on the whole device with no in-flight quota: crowd (while more clients "
        "wait than fit on the CPUs left, where it is faster), always, or off "
        "(docs/device-launch.md)",
        choice("off", "crowd", "always"), metavar="off|crowd|always", group="tuning",
    )  # fmt: skip
    engine_timings: bool = setting(
        False, "time the native engine's driver calls and client wakes (two clock reads "
        "each), logged with its counts when it stops", bool_text, switch=True, group="tuning",
    )  # fmt: skip
    cuda_max_connections: int = setting(
        DEFAULT_QUEUES, "hardware work queues per CUDA context (CUDA_DEVICE_MAX_CONNECTIONS, "
        "1-32; an operator's own CUDA_DEVICE_MAX_CONNECTIONS wins): more sessions' streams "
        "run side by side instead of aliasing onto CUDA's default 8", int_text, metavar="N",
        group="tuning",
    )  # fmt: skip
    unix_trusted: bool = setting(
        False, "with --tokens: calls on the Unix socket without a token are the default "
        "tenant", bool_text, group="security", switch=True,
    )  # fmt: skip
    tls_cert: Path | None = setting(
        None, "TLS certificate (TCP)", optional(path), metavar="PEM", group="security"
    )
    tls_key: Path | None = setting(
        None, "TLS private key (TCP)", optional(path), metavar="PEM", group="security"
    )
    tls_client_ca: Path | None = setting(
        None, "mutual TLS: TCP clients must present a certificate this CA signed",
        optional(path), metavar="PEM", group="security",
    )  # fmt: skip
    """With it, TCP clients must present a certificate this CA signed (mutual TLS)."""
    default_tenant: str = setting(
        DEFAULT_TENANT, "the tenant of calls without a token", str, metavar="NAME",
        group="security",
    )  # fmt: skip
    metrics_port: int | None = setting(
        None, "serve Prometheus metrics at http://ADDR:PORT/metrics (0 picks a port)",
        optional(int_text, "none"), metavar="PORT", group="operation",
    )  # fmt: skip
    """Prometheus metrics on this port (0 picks one); ``None``: not served."""
    metrics_address: str = setting(
        "127.0.0.1", "where metrics listen", str, metavar="ADDR", group="operation"
    )
    health_listen: str | None = setting(
        None, "also serve the health service alone, without TLS or tokens, at HOST:PORT "
        "(for the kubelet's native gRPC probes; it says SERVING or NOT_SERVING, nothing more)",
        optional(str, "none"), metavar="HOST:PORT", group="operation",
    )  # fmt: skip
    supervise: bool = setting(
        True, "serve in this process, without restarts (for systemd or a container's restart "
        "policy)", bool_text, flag="--no-supervise", switch=True, switch_value=False,
        group="operation",
    )  # fmt: skip
    """Run the server in a child process that is restarted after a device fault."""
    restart_max: int = setting(
        10, "most restarts within the window", int_text, metavar="N", group="operation"
    )
    restart_window_seconds: float = setting(
        300.0, "restart window", float_text, flag="--restart-window", metavar="SECONDS",
        group="operation",
    )  # fmt: skip
    worker_hang_seconds: float = setting(
        5.0, "a device worker silent this long (stopped, hung) is declared lost and replaced; "
        "its calls then fail with DEVICE_LOST instead of waiting", float_text,
        flag="--worker-hang", metavar="SECONDS", group="tuning",
    )  # fmt: skip
    heartbeat_seconds: float = setting(
        2.0, "Attach stream heartbeat period", float_text, metavar="SECONDS", group="tuning"
    )
    keepalive_seconds: float = setting(
        2.0, "HTTP/2 keepalive ping period", float_text, metavar="SECONDS", group="tuning"
    )
    keepalive_timeout_seconds: float = setting(
        3.0, "a connection whose keepalive ping is not answered this long is closed",
        float_text, metavar="SECONDS", group="tuning",
    )  # fmt: skip
    fault_grace_seconds: float = setting(
        0.5, "drain time after a device fault", float_text, flag="--fault-grace",
        metavar="SECONDS", group="tuning",
    )  # fmt: skip
    max_message_bytes: int = setting(
        64 * MiB, "largest gRPC message", size, metavar="BYTES", group="tuning"
    )
    read_chunk_bytes: int = setting(
        1 * MiB, "chunk size of buffer reads", size, metavar="BYTES", group="tuning"
    )
    blocking_threads: int = setting(
        32, "threads for blocking device work", int_text, metavar="N", group="tuning"
    )
    malloc_keep_bytes: int = setting(
        256 * MiB, "freed memory the process keeps for reuse (0: glibc's defaults)", size,
        metavar="BYTES", group="tuning",
    )  # fmt: skip
    """Freed memory the process keeps for reuse rather than handing back (``accyd.process.malloc``);
    0 leaves glibc's adaptive defaults, which make every streamed chunk fault in new pages."""
    quotas: Quotas = field(default_factory=Quotas)
    """The default quotas (``QUOTAS``: ``--quota-*`` and ``ACCYD_QUOTA_*``)."""

    @property
    def uses_device_workers(self) -> bool:
        """Whether each device runs in a worker process (``device_workers``, or auto)."""
        if self.device_workers is not None:
            return self.device_workers
        return len(set(self.devices)) > 1

    def gpu_of(self, device: int) -> int:
        """The GPU ordinal device ``device`` runs on (``--device-gpu``, else its own index)."""
        return dict(self.device_gpus).get(device, device)

    @property
    def kserve_memory_bytes(self) -> int:
        """The KServe door's bound on what its requests hold (``doors.kserve.held``)."""
        if self.kserve_memory_limit is not None:
            return self.kserve_memory_limit
        buffers = self.host_memory_limit or int(physical_memory() * DEFAULT_MEMORY_SHARE)
        return min(buffers // 4, 4 << 30)

    @property
    def listen_addresses(self) -> tuple[str, ...]:
        return self.listen or (f"unix:{default_socket_path()}",)

    def loop_spin_for(self, backend: str) -> float:
        """The event loop's polling for a daemon whose backend is ``backend`` ("cuda"...)."""
        if self.loop_spin_seconds is not None:
            return self.loop_spin_seconds
        return CUDA_LOOP_SPIN_SECONDS if backend == "cuda" else 0.0

    def validate(self) -> Config:
        """Refuse settings that cannot work; returns ``self``."""
        for name in (
            "heartbeat_seconds",
            "keepalive_seconds",
            "keepalive_timeout_seconds",
            "kserve_liveness_seconds",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.worker_hang_seconds < MIN_HANG_SECONDS:
            raise ValueError(f"worker_hang_seconds must be at least {MIN_HANG_SECONDS:g}")
        if self.grace_seconds < 0:
            raise ValueError("grace_seconds must not be negative")
        if not 1 <= self.read_chunk_bytes <= self.max_message_bytes - 1024:
            raise ValueError("read_chunk_bytes must be positive and below max_message_bytes")
        if not 0 <= self.launch_spin_seconds <= 0.01:
            raise ValueError("launch_spin_seconds must be between 0 and 0.01")
        if self.loop_spin_seconds is not None and not 0 <= self.loop_spin_seconds <= 0.01:
            raise ValueError("loop_spin_seconds must be between 0 and 0.01")
        if self.host_memory_limit is not None and self.host_memory_limit <= 0:
            raise ValueError("host_memory_limit must be positive")
        if self.kserve_memory_limit is not None and self.kserve_memory_limit <= 0:
            raise ValueError("kserve_memory_limit must be positive")
        if self.shared_memory_limit is not None and self.shared_memory_limit <= 0:
            raise ValueError("shared_memory_limit must be positive")
        if self.malloc_keep_bytes < 0:
            raise ValueError("malloc_keep_bytes must not be negative")
        if self.blocking_threads < 1 or not self.devices:
            raise ValueError("blocking_threads and devices need at least one")
        if not 1 <= self.cuda_max_connections <= 32:
            raise ValueError("cuda_max_connections is 1 to 32 (CUDA's hardware queues)")
        if not 0 <= self.engine_threads <= 16:
            raise ValueError("engine_threads is 0 (auto) to 16")
        if not 0 <= self.crowd_engine_threads <= 16:
            raise ValueError("crowd_engine_threads is 0 (auto) to 16")
        if self.device_gpus and not self.uses_device_workers:
            raise ValueError("--device-gpu needs device workers (--device-workers)")
        unknown = sorted({index for index, _ in self.device_gpus} - set(self.devices))
        if unknown:
            raise ValueError(f"--device-gpu names devices not served (--device): {unknown}")
        if self.log_format not in ("console", "json"):
            raise ValueError(f"log_format must be console or json, not {self.log_format!r}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("TLS needs both --tls-cert and --tls-key")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key too")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port must be a port number, not {self.metrics_port}")
        for item in dataclasses.fields(Quotas):
            limit = getattr(self.quotas, item.name)
            if limit is not None and limit < 0:
                raise ValueError(f"quota {item.name} must not be negative")
        if self.restart_max < 0 or self.restart_window_seconds <= 0:
            raise ValueError("restart_max must not be negative and restart_window positive")
        if self.kserve_http_listen and not self.kserve:
            raise ValueError("--kserve-http-listen serves the KServe door: drop --no-kserve")
        for address in (*self.listen_addresses, *self.kserve_http_listen):
            refusal = self.tcp_refusal(address)
            if refusal:
                raise ValueError(refusal)
        return self

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    def grpc_server_options(self) -> list[tuple[str, int]]:
        """The gRPC server's channel options: message sizes and keepalive."""
        keepalive_ms = int(self.keepalive_seconds * 1000)
        return [
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.keepalive_time_ms", keepalive_ms),
            ("grpc.keepalive_timeout_ms", int(self.keepalive_timeout_seconds * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.http2.min_ping_interval_without_data_ms", min(keepalive_ms, 1000)),
            ("grpc.so_reuseport", 0),
        ]

    def tcp_refusal(self, address: str) -> str | None:
        """Why ``address`` may not be served with these settings; ``None`` if it may."""
        if address.startswith("unix:") or self.insecure:
            return None
        missing = []
        if not self.tls:
            missing.append("TLS (pass --tls-cert FILE --tls-key FILE)")
        if self.tokens_file is None:
            missing.append("bearer tokens (pass --tokens FILE)")
        if not missing:
            return None
        return (
            f"refusing to serve {address} over TCP without {' or '.join(missing)}; "
            "pass --insecure to serve it anyway on a trusted network"
        )

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        quotas: Mapping[str, int | None] | None = None,
        **overrides: Any,
    ) -> Config:
        """Defaults, then ``ACCYD_<FIELD>`` (quotas: ``ACCYD_QUOTA_<NAME>``), then ``overrides``.

        ``quotas`` overrides single default quotas by name (``memory_bytes``...).
        """
        env = os.environ if environ is None else environ
        values = from_environment(SETTINGS, env)
        limits = from_environment(QUOTAS, env)
        limits.update(quotas or {})
        if limits:
            values["quotas"] = Quotas(**limits)
        values.update(overrides)
        return cls(**values).validate()


SETTINGS: tuple[Bound, ...] = tuple(settings_of(Config))
