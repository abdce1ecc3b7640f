"""Tenant accounting: the ledger of every tenant's usage, and the one reservation each charge is.

Every charge goes through ``Ledger.reserve``: the usage is taken at once
(``QuotaExceeded`` if a quota would pass) and given back when the ``with``
block ends, unless the caller ``keep()``s it once what it paid for is in
place. What the block made before it failed is undone with it, so no call
site repeats "charge, call the driver, refund on failure, check the client is
still attached, refund". Frees give usage back with ``refund``.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Protocol

from accyd.core.clients import Client
from accyd.core.limits import DaemonLimits, daemon_limits
from accyd.core.tenants import Quotas, Tenant, Usage
from accyd.errors import QuotaExceeded

__all__ = ["DEFAULT_LAUNCHES_PER_CLIENT", "EngineCounts", "Ledger", "Reservation"]

DEFAULT_LAUNCHES_PER_CLIENT = 16384
"""Launches one client may have in flight at once, unless configured otherwise: each
queued launch holds daemon memory (about 2.4 KiB), so an unbounded queue is a leak."""

CLIENT_LAUNCHES = "client_launches_in_flight"
"""The quota name a refusal by the per-client launch limit is counted and reported under."""


class EngineCounts(Protocol):
    """Launches in flight that an engine launched by itself (its tickets), counted against the
    same limits as the core's own: the ledger adds them in, and tells it of its own."""

    def in_flight(self, client: Client) -> tuple[int, int]:
        """The engine's launches in flight of ``client``, and of its tenant."""
        ...

    def published(self, client: Client) -> None:
        """The core's own count of ``client`` (or its tenant's) changed, or its quotas did."""
        ...

    def launched(self) -> int:
        """Launches the engine made by itself so far (for the daemon's totals)."""
        ...


_CEILINGED = ("sessions", "buffers", "clients", "descriptors", "host_memory_bytes")
"""What the daemon's ceiling bounds over all tenants (``accyd.core.limits``)."""


def _daemons_own(amount: Usage) -> bool:
    return bool(amount.clients or amount.descriptors or amount.host_memory_bytes)


def _count(total: Usage, amount: Usage, sign: int) -> None:
    """Add (or take away) the parts of ``amount`` the ceiling bounds."""
    for name in _CEILINGED:
        setattr(total, name, getattr(total, name) + sign * getattr(amount, name))


class Reservation:
    """Usage charged to one client's tenant; refunded when the block ends, unless kept.

    ``undo(fn)`` registers how to free something made under the reservation;
    it runs (after the refund, outside the lock) only if the reservation was not
    kept. ``keep()`` is called under the ledger's lock, together with the change
    that hands the paid-for thing to its owner.
    """

    __slots__ = ("_kept", "_ledger", "_undo", "amount", "client")

    def __init__(self, ledger: Ledger, client: Client, amount: Usage) -> None:
        self._ledger = ledger
        self.client = client
        self.amount = amount
        self._kept = False
        self._undo: list[Callable[[], object]] | None = None

    def undo(self, free: Callable[[], object]) -> None:
        """Free what ``free`` frees if the reservation ends without ``keep()``."""
        if self._undo is None:
            self._undo = []
        self._undo.append(free)

    def keep(self) -> None:
        self._kept = True

    def __enter__(self) -> Reservation:
        return self

    def __exit__(
        self, exc: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._kept:
            return
        self._ledger.refund(self.client, self.amount)
        for free in reversed(self._undo or ()):
            free()


class Ledger:
    """Tenants by name, their usage and quota refusals; changed under the core's lock."""

    def __init__(
        self,
        lock: threading.RLock,
        quotas: Quotas,
        tenant_quotas: Mapping[str, Quotas],
        *,
        launches_per_client: int | None = DEFAULT_LAUNCHES_PER_CLIENT,
        on_refused: Callable[[str, str], None] | None = None,
    ) -> None:
        self.lock = lock
        self.launches_per_client = launches_per_client
        self._quotas = quotas
        self._tenant_quotas = dict(tenant_quotas)
        self._on_refused = on_refused
        self.tenants: dict[str, Tenant] = {}
        self.refusals: dict[tuple[str, str], int] = {}
        self.engine: EngineCounts | None = None
        """An engine's own launches, once one is attached (``Daemon.attach_engine``)."""
        self.total = Usage()
        """What every tenant holds together, of what the daemon's ceiling bounds."""
        self.set_limits(daemon_limits())

    def set_limits(self, limits: DaemonLimits) -> None:
        """The daemon's ceiling and each tenant's defaults from now on (call under the lock)."""
        self.limits = limits
        self._defaults = limits.defaults_for(self._quotas)
        for tenant in self.tenants.values():
            tenant.defaults = self._defaults

    def tenant(self, name: str) -> Tenant:
        """The tenant called ``name``, made on first use (call under the lock)."""
        tenant = self.tenants.get(name)
        if tenant is None:
            quotas = self._tenant_quotas.get(name, self._quotas)
            tenant = self.tenants[name] = Tenant(
                name, quotas, defaults=self._defaults, on_refused=self._refused
            )
        return tenant

    def _refused(self, tenant: Tenant, quota: str) -> None:
        key = (tenant.name, quota)
        self.refusals[key] = self.refusals.get(key, 0) + 1
        if self._on_refused is not None:
            self._on_refused(tenant.name, quota)

    def reserve(self, client: Client, amount: Usage) -> Reservation:
        """Charge ``amount`` to the client's tenant now; see ``Reservation``."""
        with self.lock:
            self.charge(client, amount)
        return Reservation(self, client, amount)

    def charge(self, client: Client, amount: Usage) -> None:
        """Take ``amount`` (under the lock) or raise ``QuotaExceeded``; prefer ``reserve``."""
        launches = amount.launches_in_flight
        engine = self.engine
        theirs = (0, 0) if engine is None or not launches else engine.in_flight(client)
        limit = self.launches_per_client
        have = client.launches_in_flight + theirs[0]
        if launches and limit is not None and have + launches > limit:
            self._refused(client.tenant, CLIENT_LAUNCHES)
            raise QuotaExceeded(
                f"client {client.id} has {have} launches in flight, the most one client may "
                f"have is {limit}: wait for some before launching more",
                quota=CLIENT_LAUNCHES,
            )
        bounded = amount.sessions or amount.buffers or _daemons_own(amount)
        if bounded:
            self._within_ceiling(client.tenant, amount)
        client.tenant.charge(amount, theirs[1])
        client.launches_in_flight += launches
        if bounded:
            _count(self.total, amount, 1)
        if launches and engine is not None:
            engine.published(client)

    def _within_ceiling(self, tenant: Tenant, amount: Usage) -> None:
        """Refuse ``amount`` if all tenants together would pass the daemon's ceiling."""
        ceiling, total = self.limits.ceiling, self.total
        for name in _CEILINGED:
            wanted = getattr(amount, name)
            limit = getattr(ceiling, name)
            if wanted and limit is not None and getattr(total, name) + wanted > limit:
                self._refused(tenant, name)
                raise QuotaExceeded(
                    f"the daemon holds {getattr(total, name)} {name} for all "
                    f"tenants, the most it allows is {limit}; {wanted} more asked by tenant "
                    f"{tenant.name!r}: free some first",
                    quota=name,
                )

    def refund(self, client: Client, amount: Usage) -> None:
        with self.lock:
            client.tenant.refund(amount)
            client.launches_in_flight -= amount.launches_in_flight
            if amount.launches_in_flight and self.engine is not None:
                self.engine.published(client)
            if amount.sessions or amount.buffers or _daemons_own(amount):
                _count(self.total, amount, -1)

    def launches_over(self, client: Client, launches: int, scratch_bytes: int = 0) -> None:
        """Give back finished launches and the scratch they held (under the lock; no allocation)."""
        if launches or scratch_bytes:
            usage = client.tenant.usage
            usage.launches_in_flight -= launches
            usage.memory_bytes -= scratch_bytes
            client.launches_in_flight -= launches
            if launches and self.engine is not None:
                self.engine.published(client)

    def usage_of(self, tenant: Tenant, client: Client | None = None) -> Usage:
        """``tenant``'s usage, the engine's launches in flight included (``client``: any of
        its clients, through which the engine is asked)."""
        usage = dataclasses.replace(tenant.usage)
        if self.engine is not None and client is not None:
            usage.launches_in_flight += self.engine.in_flight(client)[1]
        return usage

    def refusals_of(self, tenant: str) -> dict[str, int]:
        return {quota: n for (name, quota), n in self.refusals.items() if name == tenant}
