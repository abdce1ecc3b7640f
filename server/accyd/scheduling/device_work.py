"""The device-work threads: blocking work (compiles, allocations, copies) of every door, each
client and each tenant within its share of them.

``run_for(owner, ...)`` (on the event loop) and ``submit_for(owner, ...)`` (from any
thread) run work on one ``FairPool``: one owner (a client) holds at most ``share`` of
the threads at once (a quarter of them by default), and all the clients of one tenant
(``tenant_of(owner)``) at most ``tenant_share`` (half of them); an owner's other work
queues behind its own, owners with work waiting take turns, and another tenant always
finds threads free. Waits for the device never run here (the core awaits them on the
event loop).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from concurrent.futures import Future
from typing import ParamSpec, TypeVar

from accyd.scheduling.pool import FairPool

__all__ = ["DeviceWork"]

_P = ParamSpec("_P")
_T = TypeVar("_T")

DAEMON = ""
"""The owner of the daemon's own work (``run``): a share of its own, like any client's."""


class DeviceWork:
    """``threads`` device-work threads (started as work comes), shared fairly by owners."""

    def __init__(
        self,
        threads: int,
        *,
        share: int | None = None,
        tenant_share: int | None = None,
        tenant_of: Callable[[str], str | None] | None = None,
        name: str = "accyd-device",
    ) -> None:
        self.threads = threads
        self.share = share or max(1, threads // 4)
        self.tenant_share = tenant_share or max(1, threads // 2)
        self._tenant_of = tenant_of
        self._pool = FairPool(threads, name, per_client=self.share, per_tenant=self.tenant_share)
        self._dropping = False

    def submit_for(
        self, owner: str, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs
    ) -> Future[_T]:
        """From any thread: run ``fn`` within ``owner``'s share and its tenant's, in the
        caller's log context; its future (cancelled before it starts, it never runs).
        ``PoolClosed`` once closed."""
        future: Future[_T] = Future()
        context = contextvars.copy_context()

        def work() -> None:
            if self._dropping:
                future.cancel()
                return
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = context.run(fn, *args, **kwargs)
            except BaseException as error:
                future.set_exception(error)
            else:
                future.set_result(result)

        tenant = self._tenant_of(owner) if self._tenant_of is not None else None
        self._pool.submit(owner, tenant, work)
        return future

    async def run_for(
        self, owner: str, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs
    ) -> _T:
        """``submit_for`` awaited on the event loop (cancelling the await cancels work not
        started yet)."""
        return await asyncio.wrap_future(self.submit_for(owner, fn, *args, **kwargs))

    async def run(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """The daemon's own work (no client's), awaited."""
        return await self.run_for(DAEMON, fn, *args, **kwargs)

    def close(self, *, wait: bool = True, drop_queued: bool = False) -> None:
        """Take no more work; the queued runs (or, with ``drop_queued``, is cancelled) and,
        with ``wait``, every thread is joined; idempotent."""
        if drop_queued:
            self._dropping = True
        self._pool.close(wait=wait)
