"""The core facade: typed buffers, clear size errors, launch limits, awaited teardown."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from accyd.catalog import load_catalog
from accyd.catalog.dtypes import DType, Scalar
from accyd.core.daemon import Daemon
from accyd.core.tenants import Usage
from accyd.errors import FailedPrecondition, LaunchArgumentMismatch, QuotaExceeded
from tests.core.daemon_fixtures import host_daemon, recording_daemon

SCAN = "accy.kernel.test.device_scan"
SLOW = "accy.test.slow"
N = {"n": Scalar.u32(5000)}
SLOW_CATALOG = load_catalog([Path(__file__).parents[1] / "catalogs" / "slow"])


def slow_args(ms: int) -> dict[str, Scalar]:
    return {"n": Scalar.u32(4), "ms": Scalar.u32(ms)}


def slow_session(daemon: Daemon, client_id: str) -> tuple[str, str, str]:
    session = daemon.load_pipeline(client_id, SLOW).session_id
    x = daemon.allocate_buffer(client_id, 16, DType.F32).id
    y = daemon.allocate_buffer(client_id, 16, DType.F32).id
    return session, x, y


def usage(daemon: Daemon) -> Usage:
    (tenant,) = daemon.status().tenants
    return tenant.usage


def test_a_buffer_of_another_dtype_is_refused_naming_the_operand() -> None:
    daemon, backend = recording_daemon()
    client = daemon.attach().id
    session = daemon.load_pipeline(client, SCAN).session_id
    ints = daemon.allocate_buffer(client, 20000, DType.I32).id
    untyped = daemon.allocate_buffer(client, 20000).id
    y = daemon.allocate_buffer(client, 20000, DType.F32).id
    daemon.allocate_intermediates(client, session, N)
    with pytest.raises(LaunchArgumentMismatch) as caught:
        daemon.launch(client, session, [ints], [y], N)
    assert caught.value.field == "operands[0]"
    assert "operand 'x' is f32" in caught.value.message and "i32" in caught.value.message
    assert backend.launch_count == 0
    daemon.launch(client, session, [untyped], [y], N)  # untyped buffers take any dtype
    assert backend.launch_count > 0


def test_a_small_buffer_is_refused_naming_the_operand_and_the_scalar() -> None:
    daemon, _ = recording_daemon()
    client = daemon.attach().id
    session = daemon.load_pipeline(client, SCAN).session_id
    small = daemon.allocate_buffer(client, 400, DType.F32).id
    y = daemon.allocate_buffer(client, 20000, DType.F32).id
    # The session's scratch is too small too: the caller's buffer is named first.
    daemon.allocate_intermediates(client, session, {"n": Scalar.u32(100)})
    with pytest.raises(LaunchArgumentMismatch) as caught:
        daemon.launch(client, session, [small], [y], N)
    assert caught.value.field == "operands[0]"
    assert "operand 'x' holds 400 bytes" in caught.value.message
    assert "(n x f32, n = 5000)" in caught.value.message
    big = daemon.allocate_buffer(client, 20000, DType.F32).id
    with pytest.raises(FailedPrecondition):  # with the buffers right, the scratch is next
        daemon.launch(client, session, [big], [y], N)


def test_one_client_may_have_only_so_many_launches_in_flight() -> None:
    daemon, _ = host_daemon(catalog=SLOW_CATALOG, launches_per_client=3)
    first, second = daemon.attach().id, daemon.attach().id
    session, x, y = slow_session(daemon, first)
    for _ in range(3):
        daemon.launch(first, session, [x], [y], slow_args(200))
    with pytest.raises(QuotaExceeded) as refused:
        daemon.launch(first, session, [x], [y], slow_args(200))
    assert refused.value.quota == "client_launches_in_flight"
    assert "3 launches in flight" in refused.value.message
    assert daemon.status().tenants[0].quota_refusals == {"client_launches_in_flight": 1}
    other, ox, oy = slow_session(daemon, second)  # the limit is the client's, not the tenant's
    daemon.launch(second, other, [ox], [oy], slow_args(0))
    daemon.wait_launch(first, session)
    daemon.launch(first, session, [x], [y], slow_args(0))  # finished launches count no more
    daemon.close()


def test_a_detached_clients_queued_launches_are_dropped_and_counted_until_freed() -> None:
    daemon, backend = host_daemon(catalog=SLOW_CATALOG)
    client = daemon.attach().id
    session, x, y = slow_session(daemon, client)
    daemon.launch(client, session, [x], [y], slow_args(800))
    for _ in range(9):
        daemon.launch(client, session, [x], [y], slow_args(500))
    time.sleep(0.2)  # the first kernel runs; the others wait behind it

    async def detach() -> float:
        started = time.monotonic()
        leaving = asyncio.ensure_future(daemon.detach_async(client))
        await asyncio.sleep(0.05)
        status = daemon.status()
        # Gone as a client, but its work runs on and is counted until it ends.
        assert (status.clients, status.detaching_clients, status.sessions) == (0, 1, 1)
        assert status.tenants[0].usage.launches_in_flight == 10
        await leaving
        return time.monotonic() - started

    # The running kernel ends (0.6 s more); the nine queued behind it are dropped (not 4.5 s).
    assert asyncio.run(detach()) < 2.5
    status = daemon.status()
    assert (status.detaching_clients, status.sessions, status.buffers) == (0, 0, 0)
    assert usage(daemon) == Usage()
    assert backend.memory_in_use() == 0
    daemon.close()


def test_awaited_waits_hold_no_thread_and_report_the_launch() -> None:
    daemon, _ = host_daemon(catalog=SLOW_CATALOG)
    client = daemon.attach().id
    session, x, y = slow_session(daemon, client)
    ticket = daemon.launch(client, session, [x], [y], slow_args(200))

    async def wait_many() -> None:
        waits = [daemon.wait_launch_async(client, session, ticket.launch_id) for _ in range(200)]
        await asyncio.gather(*waits)

    started = time.monotonic()
    asyncio.run(wait_many())  # 200 waits on one thread: none blocks the others
    assert 0.15 < time.monotonic() - started < 2.0
    assert usage(daemon).launches_in_flight == 0  # the wait reaped it: its quota is back

    async def release_and_free() -> None:
        daemon.launch(client, session, [x], [y], slow_args(100))
        await daemon.free_buffer_async(client, x)  # waits for the launch that reads it
        await daemon.release_async(client, session)

    asyncio.run(release_and_free())
    assert usage(daemon) == Usage(memory_bytes=16, buffers=1, clients=1)  # still attached
    daemon.close()
