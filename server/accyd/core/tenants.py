"""Tenants and their quotas: device memory, sessions, buffers, launches in flight, and the daemon's
own resources a client makes (clients, descriptors, host memory shared with clients)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields

from accyd.errors import QuotaExceeded

__all__ = ["DEFAULT_TENANT", "Placement", "Quotas", "Tenant", "Usage"]

DEFAULT_TENANT = "local"


@dataclass(frozen=True, slots=True)
class Quotas:
    """The most a tenant may hold at once; ``None`` means no limit of its own: the daemon's
    default then applies where it has one (``Tenant.defaults``)."""

    memory_bytes: int | None = None
    sessions: int | None = None
    buffers: int | None = None
    launches_in_flight: int | None = None
    clients: int | None = None
    """Clients attached at once."""
    descriptors: int | None = None
    """File descriptors the daemon holds for the tenant (segments, rings, exports)."""
    host_memory_bytes: int | None = None
    """Daemon host memory made for the tenant's clients: shared segments and rings."""


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a tenant's session streams go: an SM partition (``None``: the whole device),
    at a stream priority (0, the default, to 5: higher runs first where the device has a
    choice)."""

    partition: str | None = None
    priority: int = 0


_QUOTA_NAMES = tuple(item.name for item in fields(Quotas))


@dataclass(slots=True)
class Usage:
    """What a tenant holds now, in the same units as ``Quotas``."""

    memory_bytes: int = 0
    sessions: int = 0
    buffers: int = 0
    launches_in_flight: int = 0
    clients: int = 0
    descriptors: int = 0
    host_memory_bytes: int = 0

    def add(self, other: Usage, sign: int = 1) -> None:
        # Spelled out: this runs twice per launch, and dataclasses.fields() is slow.
        self.memory_bytes += sign * other.memory_bytes
        self.sessions += sign * other.sessions
        self.buffers += sign * other.buffers
        self.launches_in_flight += sign * other.launches_in_flight
        if other.clients or other.descriptors or other.host_memory_bytes:
            self.clients += sign * other.clients
            self.descriptors += sign * other.descriptors
            self.host_memory_bytes += sign * other.host_memory_bytes


@dataclass(eq=False, slots=True)
class Tenant:
    """One tenant: its name, quotas and current usage (changed under the daemon's lock)."""

    name: str
    quotas: Quotas = field(default_factory=Quotas)
    usage: Usage = field(default_factory=Usage)
    defaults: Quotas = field(default_factory=Quotas)
    """The daemon's limits for what ``quotas`` leaves unlimited (``accyd.core.limits``)."""
    on_refused: Callable[[Tenant, str], None] | None = field(default=None, repr=False)
    """Told of each refusal (tenant, quota name) before ``QuotaExceeded`` is raised."""
    counter: int = -1
    """The engine's in-flight counter of this tenant's launches (-1: none yet)."""

    def charge(self, amount: Usage, engine_launches: int = 0) -> None:
        """Take ``amount`` or raise ``QuotaExceeded`` naming the first quota it would pass;
        ``engine_launches`` are launches in flight an engine counts itself."""
        for name in _QUOTA_NAMES:
            wanted = getattr(amount, name)
            if not wanted:
                continue
            limit = getattr(self.quotas, name)
            if limit is None:
                limit = getattr(self.defaults, name)
            have = getattr(self.usage, name)
            if name == "launches_in_flight":
                have += engine_launches
            if limit is not None and have + wanted > limit:
                if self.on_refused is not None:
                    self.on_refused(self, name)
                raise QuotaExceeded(
                    f"tenant {self.name!r}: {name} quota is {limit}; {have} in use, "
                    f"{wanted} more asked",
                    quota=name,
                )
        self.usage.add(amount)

    def refund(self, amount: Usage) -> None:
        self.usage.add(amount, -1)
