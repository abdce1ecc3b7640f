"""Tenants and their quotas: device memory, sessions, buffers and launches in flight."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from accyd.errors import QuotaExceeded

__all__ = ["DEFAULT_TENANT", "Quotas", "Tenant", "Usage"]

DEFAULT_TENANT = "local"


@dataclass(frozen=True, slots=True)
class Quotas:
    """The most a tenant may hold at once; ``None`` means no limit."""

    memory_bytes: int | None = None
    sessions: int | None = None
    buffers: int | None = None
    launches_in_flight: int | None = None


@dataclass(slots=True)
class Usage:
    """What a tenant holds now, in the same units as ``Quotas``."""

    memory_bytes: int = 0
    sessions: int = 0
    buffers: int = 0
    launches_in_flight: int = 0

    def add(self, other: Usage, sign: int = 1) -> None:
        for item in fields(self):
            setattr(self, item.name, getattr(self, item.name) + sign * getattr(other, item.name))


@dataclass(eq=False, slots=True)
class Tenant:
    """One tenant: its name, quotas and current usage (changed under the daemon's lock)."""

    name: str
    quotas: Quotas = field(default_factory=Quotas)
    usage: Usage = field(default_factory=Usage)

    def charge(self, amount: Usage) -> None:
        """Take ``amount`` or raise ``QuotaExceeded`` naming the first quota it would pass."""
        for item in fields(amount):
            wanted = getattr(amount, item.name)
            limit = getattr(self.quotas, item.name)
            have = getattr(self.usage, item.name)
            if wanted and limit is not None and have + wanted > limit:
                raise QuotaExceeded(
                    f"tenant {self.name!r}: {item.name} quota is {limit}; {have} in use, "
                    f"{wanted} more asked",
                    quota=item.name,
                )
        self.usage.add(amount)

    def refund(self, amount: Usage) -> None:
        self.usage.add(amount, -1)
