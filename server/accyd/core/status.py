"""What the daemon reports about itself: totals, the caller's share, and every tenant's usage."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from accyd.core.tenants import Quotas, Usage

__all__ = ["DaemonStatus", "DeviceStatus", "TenantStatus"]


@dataclass(frozen=True, slots=True)
class TenantStatus:
    """One tenant's quotas, what it holds now, and its refusals by quota name."""

    name: str
    clients: int
    quotas: Quotas
    usage: Usage
    quota_refusals: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class DeviceStatus:
    """One device: what clients hold there now, and how often it was replaced after a fault."""

    index: int
    name: str
    backend: str
    serving: bool
    clients: int
    """Clients placed there or holding a session or buffer there."""
    sessions: int
    buffers: int
    memory_in_use: int
    """Bytes the device's backend has allocated (0 while it is being replaced)."""
    launches_in_flight: int
    replacements: int
    isolated: bool
    """Whether it runs in a worker process of its own (a fault there spares the rest)."""


@dataclass(frozen=True, slots=True)
class DaemonStatus:
    instance_id: str
    backend: str
    device_name: str
    serving: bool
    uptime_seconds: float
    clients: int
    sessions: int
    """Sessions alive, those of detached clients whose work still runs too."""
    buffers: int
    """Buffers alive, those of detached clients still waiting to be freed too."""
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
    detaching_clients: int = 0
    """Clients gone whose work is still being waited for before their resources are freed."""
    devices: tuple[DeviceStatus, ...] = ()
    """Each device the daemon serves, by index."""
