"""What the daemon reports about itself: totals, the caller's share, and every tenant's usage."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from accyd.backends.base import Backend
from accyd.core.clients import Client
from accyd.core.partitions import PartitionStatus
from accyd.core.placement import load_of
from accyd.core.tables import Tables
from accyd.core.tenants import Quotas, Usage
from accyd.errors import AccyError

__all__ = ["DaemonStatus", "DeviceStatus", "TenantStatus", "status_of"]


@dataclass(frozen=True, slots=True)
class TenantStatus:
    """One tenant's quotas, what it holds now, and its refusals by quota name."""

    name: str
    clients: int
    quotas: Quotas
    usage: Usage
    quota_refusals: Mapping[str, int]
    partition: str = ""
    """Its SM partition's name, ``unconfined: <why>`` where a device did not make it, or
    ``""``: the whole device."""
    priority: int = 0
    """Its session streams' priority (0 the default, up to 5)."""


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
    partitions: tuple[PartitionStatus, ...] = ()
    """Its SM partitions, with the sessions running in each."""
    unconfined: str = ""
    """Why it made no partition of those asked for (``""``: made, or none asked)."""


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


def status_of(
    tables: Tables,
    instance_id: str,
    uptime: float,
    launches: tuple[int, int],
    client_id: str | None,
    tenants: Collection[str] | None,
) -> DaemonStatus:
    """The daemon's numbers from its tables; ``launches``: (total, failed)."""
    backends = tables.backends
    memory = {device: _memory_in_use(b) for device, b in list(backends.items())}
    state, ledger = tables.state, tables.ledger
    with tables.lock:
        clients = list(tables.clients)
        leaving = tables.clients.leaving
        mine = tables.clients.find(client_id) if client_id else None
        backend = backends[min(backends)]
        loads = load_of(backends, clients + leaving)
        shown = [t for t in ledger.tenants.values() if tenants is None or t.name in tenants]
        members = {c.tenant.name: c for c in clients}
        return DaemonStatus(
            instance_id=instance_id,
            backend=backend.kind.value,
            device_name=backend.device_name,
            serving=state.serving,
            uptime_seconds=uptime,
            clients=len(clients),
            sessions=sum(len(c.sessions) for c in clients + leaving),
            buffers=sum(len(c.buffers) for c in clients + leaving),
            device_memory_in_use=sum(memory.values()),
            launches_total=launches[0] + (0 if ledger.engine is None else ledger.engine.launched()),
            launches_failed=launches[1],
            my_sessions=0 if mine is None else len(mine.sessions),
            my_buffers=0 if mine is None else len(mine.buffers),
            my_memory_in_use=0 if mine is None else mine.memory_in_use(),
            tenants=tuple(
                TenantStatus(
                    name=t.name,
                    clients=sum(1 for c in clients if c.tenant is t),
                    quotas=t.quotas,
                    usage=ledger.usage_of(t, members.get(t.name)),
                    quota_refusals=ledger.refusals_of(t.name),
                    partition=tables.partitions.tenant_note(t.name),
                    priority=tables.partitions.placement(t.name).priority,
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
                    serving=state.serving and device not in state.lost,
                    clients=max(loads[device].clients, loads[device].homed),
                    sessions=loads[device].sessions,
                    buffers=loads[device].buffers,
                    memory_in_use=memory.get(device, 0),
                    launches_in_flight=loads[device].launches_in_flight,
                    replacements=state.replacements.get(device, 0),
                    isolated=state.isolated,
                    **_partitions_of(tables, device, clients + leaving),
                )
                for device, b in sorted(backends.items())
            ),
        )


def _partitions_of(tables: Tables, device: int, clients: list[Client]) -> dict[str, Any]:
    """A device's partitions and the sessions in each (under the lock)."""
    streams = (
        (client.tenant.name, session.stream)
        for client in clients
        for session in client.sessions.values()
        if session.key.device == device
    )
    partitions, unconfined = tables.partitions.device_status(device, streams)
    return {"partitions": partitions, "unconfined": unconfined}


def _memory_in_use(backend: Backend) -> int:
    """What ``backend`` has allocated; 0 for one lost to a fault (its memory went with it)."""
    try:
        return backend.memory_in_use()
    except AccyError:
        return 0
