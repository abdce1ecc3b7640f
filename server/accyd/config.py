"""Every daemon setting in one frozen dataclass; ``ACCYD_*`` environment variables override them."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accy.protocol import default_socket_path
from accyd.core.tenants import DEFAULT_TENANT, Quotas

__all__ = ["CUDA_LOOP_SPIN_SECONDS", "ENV_PREFIX", "Config"]

ENV_PREFIX = "ACCYD_"
CUDA_LOOP_SPIN_SECONDS = 500e-6
"""The event loop's polling on the CUDA backend unless set: docs/benchmarks.md has why."""
MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class Config:
    """What ``accyd serve`` runs with. Times are seconds, sizes bytes."""

    listen: tuple[str, ...] = ()
    """Addresses: ``unix:/path`` or ``host:port``; empty means the default Unix socket."""
    backend: str = "auto"
    devices: tuple[int, ...] = (0,)
    catalog_dirs: tuple[Path, ...] = ()
    builtin_catalog: bool = True
    cache_dir: Path | None = None
    log_format: str = "console"
    log_level: str = "info"
    insecure: bool = False
    """Serve TCP without TLS and without tokens: only when the operator asks for it by name."""
    tokens_file: Path | None = None
    """The bearer tokens file (``accyd.auth``); with it every call needs a token."""
    unix_trusted: bool = False
    """With ``tokens_file``: calls on the Unix socket without a token are the default tenant."""
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    """With it, TCP clients must present a certificate this CA signed (mutual TLS)."""
    metrics_port: int | None = None
    """Prometheus metrics on this port (0 picks one); ``None``: not served."""
    metrics_address: str = "127.0.0.1"
    supervise: bool = True
    """Run the server in a child process that is restarted after a device fault."""
    restart_max: int = 10
    restart_window_seconds: float = 300.0
    heartbeat_seconds: float = 2.0
    keepalive_seconds: float = 2.0
    keepalive_timeout_seconds: float = 3.0
    grace_seconds: float = 10.0
    fault_grace_seconds: float = 0.5
    max_message_bytes: int = 64 * MiB
    read_chunk_bytes: int = 1 * MiB
    blocking_threads: int = 32
    launch_spin_seconds: float = 100e-6
    """How long a waited launch is polled on the event loop before the driver calls back.

    A short launch then answers without a round trip through the driver's
    thread; a longer one costs the loop at most this much. 0 turns it off."""
    loop_spin_seconds: float | None = None
    """How long the event loop polls before it sleeps (``accyd.spinloop``); ``None``: by
    backend, ``CUDA_LOOP_SPIN_SECONDS`` on CUDA (it takes about a fifth off a streamed
    launch's round trip) and off on the host, whose kernels need the CPU it would take."""
    malloc_keep_bytes: int = 256 * MiB
    """Freed memory the process keeps for reuse rather than handing back (``accyd.memtune``);
    0 leaves glibc's adaptive defaults, which make every streamed chunk fault in new pages."""
    default_tenant: str = DEFAULT_TENANT
    quotas: Quotas = field(default_factory=Quotas)

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
        for name in ("heartbeat_seconds", "keepalive_seconds", "keepalive_timeout_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.grace_seconds < 0:
            raise ValueError("grace_seconds must not be negative")
        if not 1 <= self.read_chunk_bytes <= self.max_message_bytes - 1024:
            raise ValueError("read_chunk_bytes must be positive and below max_message_bytes")
        if not 0 <= self.launch_spin_seconds <= 0.01:
            raise ValueError("launch_spin_seconds must be between 0 and 0.01")
        if self.loop_spin_seconds is not None and not 0 <= self.loop_spin_seconds <= 0.01:
            raise ValueError("loop_spin_seconds must be between 0 and 0.01")
        if self.malloc_keep_bytes < 0:
            raise ValueError("malloc_keep_bytes must not be negative")
        if self.blocking_threads < 1 or not self.devices:
            raise ValueError("blocking_threads and devices need at least one")
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
        for address in self.listen_addresses:
            refusal = self.tcp_refusal(address)
            if refusal:
                raise ValueError(refusal)
        return self

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

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
        values: dict[str, Any] = {}
        for item in dataclasses.fields(cls):
            raw = env.get(ENV_PREFIX + item.name.upper())
            if raw is not None and item.name in _PARSERS:
                values[item.name] = _parse(item.name, raw, _PARSERS[item.name])
        limits = {
            q.name: _parse(f"QUOTA_{q.name}", raw, _optional_int)
            for q in dataclasses.fields(Quotas)
            if (raw := env.get(f"{ENV_PREFIX}QUOTA_{q.name.upper()}")) is not None
        }
        limits.update(quotas or {})
        if limits:
            values["quotas"] = Quotas(**limits)
        values.update(overrides)
        return cls(**values).validate()


def _parse(name: str, raw: str, parser: Callable[[str], Any]) -> Any:
    try:
        return parser(raw)
    except ValueError as error:
        raise ValueError(f"{ENV_PREFIX}{name.upper()}={raw!r}: {error}") from None


def _bool(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected true or false")


def _list(raw: str, sep: str = ",") -> list[str]:
    return [part.strip() for part in raw.split(sep) if part.strip()]


def _optional_int(raw: str) -> int | None:
    return None if raw.strip() in ("", "none") else int(raw)


def _optional_float(raw: str) -> float | None:
    return None if raw.strip() in ("", "auto") else float(raw)


def _optional_path(raw: str) -> Path | None:
    return Path(raw) if raw else None


_PARSERS: dict[str, Callable[[str], Any]] = {
    "listen": lambda raw: tuple(_list(raw)),
    "backend": str,
    "devices": lambda raw: tuple(int(part) for part in _list(raw)),
    "catalog_dirs": lambda raw: tuple(Path(part) for part in _list(raw, os.pathsep)),
    "builtin_catalog": _bool,
    "cache_dir": _optional_path,
    "log_format": str,
    "log_level": str,
    "insecure": _bool,
    "tokens_file": _optional_path,
    "unix_trusted": _bool,
    "tls_cert": _optional_path,
    "tls_key": _optional_path,
    "tls_client_ca": _optional_path,
    "metrics_port": _optional_int,
    "metrics_address": str,
    "supervise": _bool,
    "restart_max": int,
    "restart_window_seconds": float,
    "heartbeat_seconds": float,
    "keepalive_seconds": float,
    "keepalive_timeout_seconds": float,
    "grace_seconds": float,
    "fault_grace_seconds": float,
    "max_message_bytes": int,
    "read_chunk_bytes": int,
    "blocking_threads": int,
    "launch_spin_seconds": float,
    "loop_spin_seconds": _optional_float,
    "malloc_keep_bytes": int,
    "default_tenant": str,
}
