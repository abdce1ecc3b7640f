"""A tenant's share of the KServe door: its inferences at once, and its open streams.

Every inference, unary or one request of a ModelStreamInfer stream, takes one of
its tenant's ``TENANT_IN_FLIGHT`` turns before anything is done for it (the model
looked up, the request checked, its tensors copied, the launch) and gives it back
once its answer is made. A tenant with many streams or connections therefore
keeps at most that many requests' work on the event loop and the device-work
threads, and another tenant's requests are served between them instead of behind
all of them (32 streams of 16 requests once took another tenant's p50 from 2 ms to
269 ms). A request waiting for a turn holds nothing but itself: a stream reads no
further request meanwhile (its own bound, ``streams.py``). A tenant keeps at most
``TENANT_STREAMS`` streams open. The state is per tenant and is dropped when the
tenant has nothing waiting or running.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

from accyd.errors import QuotaExceeded

__all__ = ["TENANT_IN_FLIGHT", "TENANT_STREAMS", "TenantTurns"]

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

    @contextlib.asynccontextmanager
    async def turn(self, tenant: str) -> AsyncIterator[None]:
        """Hold one of ``tenant``'s turns (waiting for one) for the block."""
        held = self._of(tenant)
        held.users += 1
        try:
            async with held.turns:
                held.running += 1
                try:
                    yield
                finally:
                    held.running -= 1
        finally:
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
