"""The daemon memory the KServe door holds for requests, bounded: their tensors and answers.

A request's tensors are in the daemon's memory several times over while it is
served: its message as gRPC parsed it and each raw input taken out of it, and its
answer's outputs as read back, in the answer message and as gRPC serializes it;
gRPC then keeps the answer until the caller reads it. ``request_bytes`` says how
much that is for a checked request; the door takes it from ``HeldBytes`` before
the request is served (waiting, in arrival order, while other requests hold the
rest) and gives it back once the answer has left: when the call is over for a
unary call (sent, or the caller gone), when the answer was written for a stream's
request. A tenant holds at most half the bound, so one that sends huge requests or
never reads its answers fills its own half and waits there while others go on;
one request larger than a tenant's half is refused (RESOURCE_EXHAUSTED). (100
unread 16 MiB answers once took 2.5-4 GB under a 2 GiB limit, nothing counted.)

Freed answers leave the heap fragmented (glibc keeps blocks below 32 MiB on it,
``accyd.process.malloc``): once the door holds nothing after it freed more than
``TRIM_AFTER_BYTES``, the freed pages are handed back (``malloc_trim``, on a
thread, at most once a second).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time

import structlog

from accyd.doors.kserve.tensors import Checked
from accyd.errors import QuotaExceeded
from accyd.process.malloc import trim_freed_memory

__all__ = ["TRIM_AFTER_BYTES", "HeldBytes", "Hold", "request_bytes"]

TRIM_AFTER_BYTES = 64 << 20
"""Bytes freed since the last trim that make the door trim once it holds nothing."""
_TRIM_EVERY_SECONDS = 1.0

log = structlog.get_logger("accyd.doors.kserve")


def request_bytes(checked: Checked) -> int:
    """The daemon memory serving ``checked`` takes at its peak: each input sent in the
    request twice (in its message, taken out of it), one read from a region once, each
    output answered three times (read back, in the answer, serialized) and one written to
    a region once."""
    sent = sum(i.byte_size for i in checked.inputs if i.region is None)
    read = sum(i.byte_size for i in checked.inputs if i.region is not None)
    answer = sum(o.byte_size for o in checked.outputs if o.region is None)
    written = sum(o.byte_size for o in checked.outputs if o.region is not None)
    return 2 * sent + read + 3 * answer + written


class Hold:
    """Bytes a tenant took from ``HeldBytes``; ``release`` gives them back (idempotent)."""

    __slots__ = ("_held", "size", "tenant")

    def __init__(self, held: HeldBytes | None, tenant: str, size: int) -> None:
        self._held = held
        self.tenant = tenant
        self.size = size

    def on_done(self, _: object) -> None:
        """``release``, as a call's done callback."""
        self.release()

    def release(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held._give(self.tenant, self.size)


class _Tenant:
    __slots__ = ("held", "waiting")

    def __init__(self) -> None:
        self.held = 0
        self.waiting: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()


class HeldBytes:
    """The door's bound, and each tenant's share of it (on the event loop: no lock).

    A tenant holds at most ``tenant_share`` of ``limit`` (half, as each tenant's share of
    the daemon's shared memory): a tenant whose answers are never read, or who sends huge
    requests, fills its own share and waits there, and another tenant's requests go in
    beside it. A tenant's requests wait in their order, not behind other tenants'.
    """

    def __init__(self, limit: int, tenant_share: float = 0.5) -> None:
        self.limit = limit
        self.per_tenant = max(1, int(limit * tenant_share))
        self.held = 0
        self._tenants: dict[str, _Tenant] = {}
        self._freed = 0
        """Bytes given back since the last trim."""
        self._trimmed = 0.0
        self._trimming: asyncio.Task[None] | None = None

    def held_by(self, tenant: str) -> int:
        found = self._tenants.get(tenant)
        return 0 if found is None else found.held

    async def take(self, tenant: str, size: int, what: str) -> Hold:
        """``size`` bytes for ``what`` (a request of ``tenant``), once they fit behind the
        tenant's requests waiting."""
        if size > self.per_tenant:
            raise QuotaExceeded(
                f"{what} needs {size} bytes of the daemon's memory for its tensors and answer; "
                f"the KServe door holds at most {self.per_tenant} for one tenant's requests "
                f"(half of --kserve-memory-limit): send smaller requests, or put tensors in "
                "shared memory",
                quota="kserve_memory_bytes",
            )
        mine = self._tenants.get(tenant)
        if mine is None:
            mine = self._tenants[tenant] = _Tenant()
        if not mine.waiting and self._fits(mine, size):
            self._add(mine, size)
            return Hold(self, tenant, size)
        turn = asyncio.get_running_loop().create_future()
        mine.waiting.append((size, turn))
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # given its bytes as it was cancelled
                self._give(tenant, size)
            else:
                with contextlib.suppress(ValueError):  # unless passed over, being cancelled
                    mine.waiting.remove((size, turn))
                self._wake()
                self._forget_if_idle(tenant, mine)
            raise
        return Hold(self, tenant, size)

    def _fits(self, tenant: _Tenant, size: int) -> bool:
        return tenant.held + size <= self.per_tenant and self.held + size <= self.limit

    def _add(self, tenant: _Tenant, size: int) -> None:
        tenant.held += size
        self.held += size

    def _forget_if_idle(self, name: str, tenant: _Tenant) -> None:
        if not tenant.held and not tenant.waiting and self._tenants.get(name) is tenant:
            del self._tenants[name]

    def _give(self, name: str, size: int) -> None:
        tenant = self._tenants[name]
        tenant.held -= size
        self.held -= size
        self._freed += size
        self._wake()
        self._forget_if_idle(name, tenant)
        if not self.held and self._freed >= TRIM_AFTER_BYTES:
            self._trim_soon()

    def _wake(self) -> None:
        """Let each tenant's waiting in, in their order, while its first fits."""
        for tenant in list(self._tenants.values()):
            waiting = tenant.waiting
            while waiting and (waiting[0][1].done() or self._fits(tenant, waiting[0][0])):
                size, turn = waiting.popleft()
                if turn.done():  # cancelled while waiting
                    continue
                self._add(tenant, size)
                turn.set_result(None)

    def _trim_soon(self) -> None:
        now = time.monotonic()
        if now - self._trimmed < _TRIM_EVERY_SECONDS or self._trimming is not None:
            return
        self._trimmed, self._freed = now, 0
        self._trimming = asyncio.get_running_loop().create_task(self._trim())

    async def _trim(self) -> None:
        try:
            await asyncio.to_thread(trim_freed_memory)
        except Exception as error:  # never a request's failure
            log.info("freed memory not trimmed", error=repr(error))
        finally:
            self._trimming = None
