"""A tenant's share of the KServe door: its inferences at once, and its open streams.

Every inference, unary or one request of a ModelStreamInfer stream, takes one of
its tenant's ``TENANT_IN_FLIGHT`` turns before anything is done for it (the model
looked up, the request checked, its tensors copied, the launch) and gives it back
once its answer is made. A tenant with many streams or connections therefore
keeps at most that many requests' work on the event loop and the device-work
threads, and another tenant's requests are served between them instead of behind
all of them (32 streams of 16 requests once took another tenant's p50 from 2 ms to
269 ms). A stream's reader takes the turn for the request it read before it reads
another, so a tenant's requests read and not yet answered are its turns plus one
per stream waiting for one; a unary call takes its turn before it is checked. A tenant keeps at most
``TENANT_STREAMS`` streams open. The state is per tenant and is dropped when the
tenant has nothing waiting or running.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from accyd.errors import QuotaExceeded

__all__ = ["TENANT_IN_FLIGHT", "TENANT_STREAMS", "TenantTurns", "Turn"]

TENANT_IN_FLIGHT = 16
"""Inferences of one tenant checked, copied or running at once, across the door."""
TENANT_STREAMS = 64
"""ModelStreamInfer streams one tenant may hold open at once."""


@dataclass
class _Tenant:
    turns: asyncio.Semaphore
    users: int = 0
    """Requests waiting for a turn or holding one."""
    running: int = 0
    """Requests holding a turn."""
    streams: int = 0


class Turn:
    """One turn of a tenant's, held until ``release`` (idempotent)."""

    __slots__ = ("_held", "_tenant", "_turns")

    def __init__(self, turns: TenantTurns, tenant: str, held: _Tenant) -> None:
        self._turns: TenantTurns | None = turns
        self._tenant = tenant
        self._held = held

    def release(self) -> None:
        turns, self._turns = self._turns, None
        if turns is not None:
            turns._release(self._tenant, self._held)


class TenantTurns:
    """Each tenant's turns and open streams (on the event loop: no lock)."""

    def __init__(self, in_flight: int = TENANT_IN_FLIGHT, streams: int = TENANT_STREAMS) -> None:
        self.in_flight = in_flight
        self.streams = streams
        self._tenants: dict[str, _Tenant] = {}

    def running(self, tenant: str) -> int:
        """The tenant's requests holding a turn now."""
        held = self._tenants.get(tenant)
        return 0 if held is None else held.running

    def streams_of(self, tenant: str) -> int:
        """The tenant's streams open now."""
        held = self._tenants.get(tenant)
        return 0 if held is None else held.streams

    def _of(self, tenant: str) -> _Tenant:
        held = self._tenants.get(tenant)
        if held is None:
            held = self._tenants[tenant] = _Tenant(asyncio.Semaphore(self.in_flight))
        return held

    def _forget_if_idle(self, tenant: str, held: _Tenant) -> None:
        if not held.users and not held.streams and self._tenants.get(tenant) is held:
            del self._tenants[tenant]

    async def acquire(self, tenant: str) -> Turn:
        """One of ``tenant``'s turns, once one is free; ``release`` it (any task may)."""
        held = self._of(tenant)
        held.users += 1
        try:
            await held.turns.acquire()
        except BaseException:
            held.users -= 1
            self._forget_if_idle(tenant, held)
            raise
        held.running += 1
        return Turn(self, tenant, held)

    def _release(self, tenant: str, held: _Tenant) -> None:
        held.running -= 1
        held.turns.release()
        held.users -= 1
        self._forget_if_idle(tenant, held)

    @contextlib.contextmanager
    def stream(self, tenant: str) -> Iterator[None]:
        """Count one open stream of ``tenant`` for the block; ``QuotaExceeded`` at the most."""
        held = self._of(tenant)
        if held.streams >= self.streams:
            self._forget_if_idle(tenant, held)
            raise QuotaExceeded(
                f"tenant {tenant!r} has {held.streams} ModelStreamInfer streams open, the most "
                "it may: send more requests on the streams it has, or close some",
                quota="kserve_streams",
            )
        held.streams += 1
        try:
            yield
        finally:
            held.streams -= 1
            self._forget_if_idle(tenant, held)
