"""A pool of threads shared by many clients, each with a bounded share: nobody fills it alone.

Work is submitted with its owner (a client, and that client's tenant). At most
``per_client`` pieces of one client and ``per_tenant`` of one tenant run at
once; the rest waits in its owner's queue, and owners with work waiting take
turns (round robin), so a client with a thousand queued pieces delays another
client by one piece of work at most, and a tenant of many clients leaves the
threads beyond its share to the other tenants. The work must not wait for the
device or for anything a client controls: it is given its thread only to do
its own blocking part (waits happen before it is submitted).
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable

__all__ = ["FairPool", "PoolClosed"]


class PoolClosed(RuntimeError):
    """The pool was closed: it takes no more work."""


class FairPool:
    """``threads`` threads (started as work comes, joined by ``close``), shared fairly."""

    def __init__(self, threads: int, name: str, *, per_client: int, per_tenant: int) -> None:
        if threads < 1 or per_client < 1 or per_tenant < 1:
            raise ValueError("a pool needs at least one thread and a share of one")
        self.threads = threads
        self.per_client = per_client
        self.per_tenant = per_tenant
        self._name = name
        self._cond = threading.Condition()
        self._queues: dict[str, deque[Callable[[], None]]] = {}
        self._tenant_of: dict[str, str | None] = {}
        self._turns: deque[str] = deque()
        """Clients with work waiting, in the order they get their next turn."""
        self._running: dict[str, int] = {}
        self._running_tenants: dict[str, int] = {}
        self._workers: list[threading.Thread] = []
        self._idle = 0
        """Threads waiting for work and not yet woken for any."""
        self._closed = False

    def submit(self, client: str, tenant: str | None, work: Callable[[], None]) -> None:
        """Queue ``work`` for ``client`` of ``tenant`` (``None``: no tenant's share applies);
        it runs when a thread and its shares allow. ``work`` reports its own outcome (its
        exceptions are not kept)."""
        with self._cond:
            if self._closed:
                raise PoolClosed(f"{self._name} is closed")
            queue = self._queues.get(client)
            if queue is None:
                queue = self._queues[client] = deque()
                self._turns.append(client)
            queue.append(work)
            self._tenant_of[client] = tenant
            if self._idle:  # each piece wakes a thread of its own, never one woken already
                self._idle -= 1
                self._cond.notify()
            elif len(self._workers) < self.threads:
                thread = threading.Thread(
                    target=self._serve, name=f"{self._name}-{len(self._workers)}", daemon=True
                )
                self._workers.append(thread)
                thread.start()

    def waiting(self) -> int:
        """Pieces of work queued and not started."""
        with self._cond:
            return sum(len(queue) for queue in self._queues.values())

    def _take(self) -> tuple[str, str | None, Callable[[], None]] | None:
        """Under the lock: the next piece of work whose owner's shares allow it."""
        for _ in range(len(self._turns)):
            client = self._turns[0]
            tenant = self._tenant_of[client]
            if self._running.get(client, 0) < self.per_client and (
                tenant is None or self._running_tenants.get(tenant, 0) < self.per_tenant
            ):
                queue = self._queues[client]
                work = queue.popleft()
                self._turns.popleft()
                if queue:
                    self._turns.append(client)  # its next piece waits for the others' turns
                else:
                    del self._queues[client]
                self._running[client] = self._running.get(client, 0) + 1
                if tenant is not None:
                    self._running_tenants[tenant] = self._running_tenants.get(tenant, 0) + 1
                return client, tenant, work
            self._turns.rotate(-1)
        return None

    def _serve(self) -> None:
        """One thread: take what the shares allow, run it, again. A piece that ends frees one
        share at most, so the thread that ran it takes whatever that let run: no other wakes."""
        while True:
            with self._cond:
                while (taken := self._take()) is None:
                    if self._closed and not self._queues:
                        self._cond.notify_all()  # the other threads see it too, and end
                        return
                    self._idle += 1
                    self._cond.wait()
            client, tenant, work = taken
            with contextlib.suppress(BaseException):  # the work reports its own failures
                work()
            del taken, work  # let its arguments and result go now, not when the next piece comes
            with self._cond:
                _less(self._running, client)
                if tenant is not None:
                    _less(self._running_tenants, tenant)
                if client not in self._queues:
                    self._tenant_of.pop(client, None)

    def close(self, *, wait: bool = True) -> None:
        """Take no more work; run what is queued and, with ``wait``, wait for every thread;
        idempotent."""
        with self._cond:
            self._closed = True
            workers = list(self._workers)
            self._idle = 0
            self._cond.notify_all()
        if wait:
            for worker in workers:
                worker.join()


def _less(counts: dict[str, int], key: str) -> None:
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]
