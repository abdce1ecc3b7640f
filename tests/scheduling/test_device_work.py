"""The device-work threads: each client and each tenant holds at most its share of them."""

from __future__ import annotations

import asyncio
import threading
import time
import weakref

from accyd.scheduling import DeviceWork


def test_a_tenants_clients_together_hold_at_most_half_the_threads() -> None:
    async def scenario() -> float:
        tenants = {f"a{i}": "a" for i in range(8)} | {"b": "b"}
        work = DeviceWork(8, tenant_of=tenants.get)
        gate = threading.Event()
        held = [asyncio.ensure_future(work.run_for(f"a{i % 8}", gate.wait, 10)) for i in range(32)]
        await asyncio.sleep(0.1)
        started = time.perf_counter()
        await work.run_for("b", time.sleep, 0)
        took = time.perf_counter() - started
        gate.set()
        await asyncio.gather(*held)
        work.close()
        return took

    took = asyncio.run(scenario())
    assert took < 0.5, f"tenant b waited {took:.2f} s behind tenant a's eight clients"


def test_work_lets_go_of_its_arguments_and_result_once_it_ends() -> None:
    """A buffer handed to a thread (a record, an export's memory) is freed when its owner
    lets it go, not when the thread next runs something."""

    class Held:
        pass

    async def scenario() -> bool:
        work = DeviceWork(1)
        held = Held()
        kept = weakref.ref(held)
        assert await work.run_for("a", lambda given: given, held) is held
        del held
        deadline = time.monotonic() + 2
        while kept() is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        let_go = kept() is None
        work.close()
        return let_go

    assert asyncio.run(scenario()), "the thread that ran the work still holds it"
