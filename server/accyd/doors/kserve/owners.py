"""The KServe door's clients: one daemon client per tenant and caller, with liveness.

tritonclient and perf_analyzer never Attach, so the door attaches for them. A
caller is its tenant (from its token, or the default tenant) and who it is on
this host: on TCP from the loopback, the user owning its end of the connection
(the kernel's socket table says; perf_analyzer registers regions on one
connection and infers on others, so a connection alone cannot be the client);
on a Unix socket, whose calls carry no connection, the tenant alone (and
shared memory only while no other user may connect there); from another host,
its connection. The client owns the sessions, pooled buffers and
shared-memory regions its calls make. It is detached, and all of that freed,
once none of its loopback connections is open any more (read each sweep), once
it made no call for ``liveness`` seconds, or at shutdown; never while one of
its calls runs. A tenant holds at most ``max_per_tenant`` such clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from accyd.core.interface import Core
from accyd.doors.kserve.cuda_regions import CudaRegions
from accyd.doors.kserve.peers import (
    Peer,
    TcpTable,
    loopback_owner,
    others_may_connect,
    parse_peer,
)
from accyd.doors.kserve.regions import Regions
from accyd.doors.kserve.sessions import ModelSessions
from accyd.errors import PermissionDenied, QuotaExceeded
from accyd.tokens import Principal

__all__ = ["DEFAULT_LIVENESS_SECONDS", "MAX_PER_TENANT", "Owner", "Owners"]

DEFAULT_LIVENESS_SECONDS = 60.0
MAX_PER_TENANT = 256
SWEEP_SECONDS = 1.0
MAX_CONNECTIONS = 1024
"""Loopback connections remembered per client (more share its liveness with these)."""

log = structlog.get_logger("accyd.doors.kserve")


@dataclass(eq=False)
class Owner:
    """One KServe caller: its daemon client and what it made."""

    key: tuple[str, str]
    client_id: str
    principal: Principal
    peer: Peer
    models: ModelSessions
    uid: int | None = None
    """The user of its loopback connections; ``None`` on the Unix socket or from afar."""
    connections: set[str] = field(default_factory=set)
    """Its open loopback connections (peer texts), while ``uid`` is known."""
    regions: Regions = field(default_factory=Regions)
    last_seen: float = field(default_factory=time.monotonic)
    busy: int = 0
    """Calls of its running now: it is not dropped meanwhile."""

    @property
    def tenant(self) -> str:
        return self.principal.tenant


class Owners:
    """Every KServe caller's client, made at its first call and dropped by the sweep."""

    def __init__(
        self,
        daemon: Core,
        models: Callable[[str], ModelSessions],
        *,
        liveness_seconds: float = DEFAULT_LIVENESS_SECONDS,
        max_per_tenant: int = MAX_PER_TENANT,
        cuda: CudaRegions | None = None,
        unix_sockets: tuple[Path, ...] = (),
    ) -> None:
        """``unix_sockets``: where the daemon's doors listen on Unix sockets (their callers
        are all ``unix:``), to judge who may register shared memory there."""
        self.daemon = daemon
        self.unix_sockets = unix_sockets
        self.cuda = cuda
        self._models = models
        self.liveness_seconds = liveness_seconds
        self.max_per_tenant = max_per_tenant
        self._owners: dict[tuple[str, str], Owner] = {}
        self._uids: dict[str, int] = {}
        """The user of each open loopback connection seen (peer text), until it closes."""
        self._sweeping: asyncio.Task[None] | None = None
        self._dropping: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._owners)

    def caller_uid(self, owner: Owner) -> int:
        """The user whose shared-memory objects ``owner``'s calls may register.

        On the loopback, the user owning the caller's end of its connection. On a Unix
        socket, whose calls name no connection and no user, the daemon's own user, and
        only while no other user may connect to any of its Unix sockets: a caller let in
        by a socket's group could otherwise read and write what only the daemon's user
        may. ``PermissionDenied`` there and for a caller on another host.
        """
        if owner.peer.unix:
            shared = [p for p in self.unix_sockets if others_may_connect(p)]
            if shared:
                raise PermissionDenied(
                    f"shared memory is not registered over {shared[0]}: other users may "
                    "connect to it and gRPC does not say which user calls, so the daemon "
                    "cannot tell whose objects are yours. Connect over TCP from this host "
                    "(the kernel names your user there), send the tensors in the request, "
                    "or keep the socket's folder to the daemon's user (mode 0700)",
                    field="key",
                )
            return os.geteuid()
        if owner.uid is None:
            raise PermissionDenied(
                "system shared memory is only for callers on the daemon's host (its Unix "
                "socket, or TCP from the loopback): send the tensors in the request",
                field="key",
            )
        return owner.uid

    def of_tenant(self, tenant: str) -> list[Owner]:
        return [o for o in self._owners.values() if o.tenant == tenant]

    def drop_tenants_but(self, kept: Collection[str]) -> int:
        """Drop the clients of every tenant but those ``kept`` (a tokens reload named no
        others); how many."""
        gone = [o for o in self._owners.values() if o.tenant not in kept]
        for owner in gone:
            log.info("kserve client dropped", client_id=owner.client_id, why="tenant revoked")
            self.drop_later(owner)
        return len(gone)

    async def find(self, principal: Principal, peer: Peer) -> Owner | None:
        """The caller's client if it has one (marked seen); nothing is made."""
        owner = self._owners.get((principal.tenant, (await self._who(peer, fresh=False))[0]))
        if owner is not None:
            owner.last_seen = time.monotonic()
        return owner

    async def enter(self, principal: Principal, peer: Peer, *, fresh: bool = False) -> Owner:
        """The caller's client, attached at its first call; ``leave`` it when the call ends.

        ``fresh``: read the socket table now rather than trust what an earlier
        call of the same connection found (registering shared memory).
        """
        who, uid = await self._who(peer, fresh=fresh)
        key = (principal.tenant, who)
        owner = self._owners.get(key)
        if owner is None:
            held = sum(1 for k in self._owners if k[0] == principal.tenant)
            if held >= self.max_per_tenant:
                raise QuotaExceeded(
                    f"tenant {principal.tenant!r} has {held} KServe callers with state in the "
                    "daemon, the most it may: close some",
                    quota="kserve_clients",
                )
            client = self.daemon.attach("kserve", principal.tenant, principal.quotas)
            owner = Owner(key, client.id, principal, peer, self._models(client.id), uid=uid)
            self._owners[key] = owner
            log.info("kserve client attached", client_id=client.id, caller=who)
            self._start_sweep()
        if uid is not None and len(owner.connections) < MAX_CONNECTIONS:
            owner.connections.add(peer.text)
        owner.busy += 1
        owner.last_seen = time.monotonic()
        return owner

    async def _who(self, peer: Peer, *, fresh: bool) -> tuple[str, int | None]:
        """Who a call's peer is here: ``unix:``, ``uid:<n>`` on the loopback, else the peer."""
        if peer.unix:
            return "unix:", None
        if not peer.local:
            return peer.text, None
        uid = None if fresh else self._uids.get(peer.text)
        if uid is None:
            uid = await asyncio.to_thread(loopback_owner, peer)
            if uid is None:  # not in this host's table (another network namespace)
                return peer.text, None
            if len(self._uids) >= MAX_CONNECTIONS * 4:
                self._uids.clear()
            self._uids[peer.text] = uid
        return f"uid:{uid}", uid

    def leave(self, owner: Owner) -> None:
        owner.busy -= 1
        owner.last_seen = time.monotonic()

    def _start_sweep(self) -> None:
        if self._sweeping is None or self._sweeping.done():
            # A context of its own: not the first caller's (its log fields, its principal).
            loop = asyncio.get_running_loop()
            self._sweeping = loop.create_task(self._sweep(), context=contextvars.Context())

    async def _sweep(self) -> None:
        while self._owners:
            await asyncio.sleep(SWEEP_SECONDS)
            wanted = self._uids or any(o.uid is not None for o in self._owners.values())
            # Two readings: an open connection one reading missed would drop its client.
            table = await asyncio.to_thread(TcpTable, readings=2) if wanted else None
            self.sweep_once(table)

    def sweep_once(self, table: TcpTable | None) -> None:
        """Forget closed connections (``table``: the socket table read now, if any loopback
        caller is known); drop every idle client with none left or gone silent."""
        now = time.monotonic()
        if table is not None:
            for text in [t for t in self._uids if table.owner(parse_peer(t)) is None]:
                del self._uids[text]
        for owner in list(self._owners.values()):
            if table is not None and owner.uid is not None:
                owner.connections = {
                    c for c in owner.connections if table.owner(parse_peer(c)) == owner.uid
                }
            if owner.busy:
                continue
            closed = owner.uid is not None and not owner.connections
            silent = now - owner.last_seen > self.liveness_seconds
            if closed or silent:
                log.info(
                    "kserve client dropped",
                    client_id=owner.client_id,
                    why="connections closed" if closed else "silent",
                )
                self.drop_later(owner)

    def drop_later(self, owner: Owner) -> None:
        """Forget ``owner`` now; its regions, sessions and buffers are freed in the background."""
        if self._owners.get(owner.key) is owner:
            del self._owners[owner.key]
        self._track(self._drop(owner))

    def _track(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._dropping.add(task)
        task.add_done_callback(self._dropping.discard)

    async def _drop(self, owner: Owner) -> None:
        try:
            owner.regions.close()
            if self.cuda is not None:
                await asyncio.to_thread(self.cuda.unregister, owner.client_id, "")
            owner.models.forget()
            await self.daemon.detach_async(owner.client_id)
        except Exception:
            log.exception("kserve client drop failed", client_id=owner.client_id)

    async def close(self) -> None:
        """Drop every client and wait until each is freed."""
        if self._sweeping is not None:
            self._sweeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeping
        for owner in list(self._owners.values()):
            self.drop_later(owner)
        while self._dropping:
            await asyncio.gather(*list(self._dropping), return_exceptions=True)
