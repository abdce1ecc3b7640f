"""The device-work threads: each client and each tenant holds at most its share of them."""

from __future__ import annotations

import asyncio
import threading
import time

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
