"""The fair pool: each client and tenant within its share, waiting clients taking turns."""

from __future__ import annotations

import threading
import time

import pytest

from accyd.scheduling import FairPool, PoolClosed


def test_a_tenant_of_many_clients_leaves_the_threads_past_its_share_to_others() -> None:
    pool = FairPool(4, "test", per_client=2, per_tenant=2)
    gate = threading.Event()
    running: list[str] = []
    lock = threading.Lock()

    def held(name: str) -> None:
        with lock:
            running.append(name)
        gate.wait(10)

    for client in range(6):  # one tenant's six clients, three pieces of work each
        for _ in range(3):
            pool.submit(f"a{client}", "a", lambda c=client: held(f"a{c}"))
    done = threading.Event()
    pool.submit("b0", "b", done.set)
    assert done.wait(2), "another tenant's work waited behind a tenant past its share"
    time.sleep(0.1)
    assert len(running) == 2, running  # tenant a: two at once, however many it queued
    gate.set()
    pool.close()
    assert len(running) == 18


def test_waiting_clients_take_turns_and_a_closed_pool_refuses() -> None:
    pool = FairPool(1, "test", per_client=1, per_tenant=1)
    order: list[str] = []
    gate = threading.Event()
    pool.submit("first", "t1", lambda: gate.wait(10))
    time.sleep(0.05)
    for _ in range(3):
        pool.submit("busy", "t2", lambda: order.append("busy"))
    pool.submit("late", "t3", lambda: order.append("late"))
    gate.set()
    pool.close()
    assert order.index("late") <= 1, order  # not behind all of busy's queue
    with pytest.raises(PoolClosed):
        pool.submit("x", "y", lambda: None)
