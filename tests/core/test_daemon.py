"""The daemon's state on the recording and host backends: ownership, scratch, quotas, lifecycle."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import structlog.testing

from accyd.catalog.dtypes import DType, Scalar
from accyd.core.daemon import Daemon, Tensor, WouldBlock
from accyd.core.tenants import Quotas, Usage
from accyd.errors import (
    DeviceFault,
    FailedPrecondition,
    InvalidRequest,
    LaunchArgumentMismatch,
    LaunchFailed,
    NotFound,
    QuotaExceeded,
    Unavailable,
)
from tests.core.daemon_fixtures import host_daemon, recording_daemon

SCAN = "accy.kernel.test.device_scan"
N = {"n": Scalar.u32(5000)}


def scan_session(daemon: Daemon, client_id: str) -> tuple[str, str, str]:
    session = daemon.load_pipeline(client_id, SCAN).session_id
    x = daemon.allocate_buffer(client_id, 20000, DType.F32).id
    y = daemon.allocate_buffer(client_id, 20000, DType.F32).id
    return session, x, y


def test_another_clients_ids_are_answered_as_unknown_ones() -> None:
    daemon, _ = recording_daemon()
    alice, bob = daemon.attach("alice").id, daemon.attach("bob").id
    session, x, y = scan_session(daemon, alice)
    for call in (
        lambda owner, sid: daemon.release(owner, sid),
        lambda owner, sid: daemon.launch(owner, sid, [x], [y], N),
        lambda owner, sid: daemon.wait_launch(owner, sid),
    ):
        with pytest.raises(NotFound) as foreign:
            call(bob, session)
        with pytest.raises(NotFound) as unknown:
            call(bob, "ses_unknown")
        assert foreign.value.field == unknown.value.field == "session_id"
    for buffer_call in (daemon.free_buffer, daemon.open_read, daemon.open_write):
        with pytest.raises(NotFound):
            buffer_call(bob, x)
    bob_session = daemon.load_pipeline(bob, SCAN).session_id
    with pytest.raises(NotFound) as caught:
        daemon.launch(bob, bob_session, [x], [y], N)
    assert caught.value.field == "operands[0]"


def test_load_pipeline_returns_the_clients_existing_session() -> None:
    daemon, backend = recording_daemon()
    client = daemon.attach().id
    first = daemon.load_pipeline(client, SCAN)
    again = daemon.load_pipeline(client, SCAN)
    assert first.created and not again.created and first.session_id == again.session_id
    assert backend.load_count == 3
    assert daemon.load_pipeline(daemon.attach().id, SCAN).session_id != first.session_id


def test_launch_without_scratch_makes_and_frees_its_own() -> None:
    daemon, backend = recording_daemon()
    client = daemon.attach().id
    session, x, y = scan_session(daemon, client)
    with pytest.raises(WouldBlock):  # a door is told to finish it off its thread
        daemon.launch(client, session, [x], [y], N)
    assert backend.launch_count == 0 and backend.memory_in_use() == 40000
    ticket = daemon.launch(client, session, [x], [y], N, may_block=True)
    assert ticket.must_wait and backend.launch_count == 3
    assert backend.memory_in_use() == 40000 + 2 * 79 * 4
    daemon.wait_launch(client, session, ticket.launch_id)
    assert backend.memory_in_use() == 40000


def test_allocated_scratch_is_reused_and_a_larger_launch_is_refused() -> None:
    daemon, backend = recording_daemon()
    client = daemon.attach().id
    session, x, y = scan_session(daemon, client)
    assert daemon.allocate_intermediates(client, session, {"n": Scalar.u32(4000)}) == 2 * 63 * 4
    allocations = backend.buffer_allocate_count
    small = daemon.launch(client, session, [x], [y], {"n": Scalar.u32(4000)})
    assert not small.must_wait and backend.buffer_allocate_count == allocations
    with pytest.raises(FailedPrecondition, match="AllocateIntermediates") as caught:
        daemon.launch(client, session, [x], [y], N)
    assert caught.value.field == "runtime_scalars"
    assert daemon.allocate_intermediates(client, session, N) == 2 * 79 * 4
    daemon.launch(client, session, [x], [y], N)
    assert daemon.status(client).launches_failed == 1


def test_launch_refusals_launch_nothing() -> None:
    daemon, backend = recording_daemon()
    client = daemon.attach().id
    session, x, y = scan_session(daemon, client)
    small = daemon.allocate_buffer(client, 16).id
    refusals = [
        (([x, x], [y], N), "operands"),
        (([x], [y], {}), "runtime_scalars.n"),
        (([small], [y], N), "operands[0]"),
        (([x], [""], N), "results[0]"),
    ]
    for (operands, results, scalars), field in refusals:
        with pytest.raises((LaunchArgumentMismatch, InvalidRequest)) as caught:
            daemon.launch(client, session, operands, results, scalars)
        assert caught.value.field == field
    assert backend.launch_count == 0
    assert backend.memory_in_use() == 40016


def test_detach_frees_everything_the_client_owned() -> None:
    daemon, backend = recording_daemon()
    client = daemon.attach().id
    session, x, y = scan_session(daemon, client)
    daemon.allocate_intermediates(client, session, N)
    daemon.launch(client, session, [x], [y], N)
    daemon.detach(client)
    assert backend.memory_in_use() == 0
    assert backend.live_ids == set()
    assert daemon.status().clients == 0
    with pytest.raises(NotFound):
        daemon.launch(client, session, [x], [y], N)
    daemon.detach(client)  # idempotent


def test_quotas_refuse_past_the_limit_and_leave_nothing_half_made() -> None:
    daemon, backend = recording_daemon(Quotas(memory_bytes=50000, buffers=2, sessions=1))
    client = daemon.attach().id
    session, x, _ = scan_session(daemon, client)
    with pytest.raises(QuotaExceeded) as caught:
        daemon.allocate_buffer(client, 8)
    assert caught.value.quota == "buffers"
    with pytest.raises(QuotaExceeded) as caught:
        daemon.allocate_intermediates(client, session, {"n": Scalar.u32(4096 * 64 * 64)})
    assert caught.value.quota == "memory_bytes"
    daemon.free_buffer(client, x)
    with pytest.raises(QuotaExceeded):
        daemon.allocate_buffer(client, 40000)
    assert backend.memory_in_use() == 20000
    other = daemon.attach().id  # same tenant: the session quota is shared
    with pytest.raises(QuotaExceeded):
        daemon.load_pipeline(other, SCAN)


def test_draining_refuses_new_work_but_frees_and_waits() -> None:
    daemon, _ = recording_daemon()
    client = daemon.attach().id
    session, x, y = scan_session(daemon, client)
    daemon.begin_drain()
    assert not daemon.serving
    with pytest.raises(Unavailable):
        daemon.launch(client, session, [x], [y], N)
    with pytest.raises(Unavailable):
        daemon.attach()
    daemon.wait_launch(client, session)
    daemon.free_buffer(client, x)
    assert daemon.wait_idle(1.0)
    with structlog.testing.capture_logs() as logs:
        daemon.begin_drain()  # again, as a server's stop does before close: said once
        daemon.close()
    assert [entry["event"] for entry in logs].count("draining") == 0


def test_a_device_fault_makes_every_later_call_fail_naming_the_session() -> None:
    faults: list[DeviceFault] = []
    daemon, backend = recording_daemon(on_fault=faults.append)
    client = daemon.attach().id
    session, x, y = scan_session(daemon, client)
    daemon.allocate_intermediates(client, session, N)

    def poisoned(request: object) -> None:
        raise DeviceFault("illegal address")

    backend.launch = poisoned  # type: ignore[method-assign]
    with pytest.raises(DeviceFault):
        daemon.launch(client, session, [x], [y], N)
    assert [f.session for f in faults] == [session]
    assert not daemon.serving
    with pytest.raises(DeviceFault) as caught:
        daemon.wait_launch(client, session)
    assert caught.value.session == session


def test_reaping_after_a_device_fault_raises_nothing() -> None:
    """The tidy-up after a streamed launch's answer must not turn into a second error."""
    daemon, backend = recording_daemon()
    client = daemon.attach().id
    session, x, y = scan_session(daemon, client)
    daemon.allocate_intermediates(client, session, N)
    daemon.launch(client, session, [x], [y], N)

    def poisoned(event: object) -> bool:
        raise DeviceFault("illegal address")

    backend.event_done = poisoned  # type: ignore[method-assign]
    daemon.reap(client, session)  # the session's log holds a launch whose mark now raises
    daemon.reap(client, "ses_unknown")  # and a session that is gone is nothing to drop
    # Nothing was found finished, so nothing was given back: the launch is still charged.
    assert daemon.status().tenants[0].usage.launches_in_flight == 1


def test_an_ordinary_launch_failure_fails_one_call() -> None:
    daemon, backend = recording_daemon()
    client = daemon.attach().id
    session, x, y = scan_session(daemon, client)
    backend.fail_launch_after_count = 1
    with pytest.raises(LaunchFailed):
        daemon.launch(client, session, [x], [y], N, may_block=True)
    daemon.wait_launch(client, session)
    assert daemon.serving
    assert backend.memory_in_use() == 40000
    # The failed launch's scratch and its place in flight were given back to the tenant.
    (tenant,) = daemon.status().tenants
    assert tenant.usage == Usage(memory_bytes=40000, sessions=1, buffers=2, clients=1)


def test_host_scan_results_and_in_order_chain() -> None:
    daemon, backend = host_daemon()
    client = daemon.attach().id
    rng = np.random.default_rng(1)
    n = 10000
    x = rng.random(n, dtype=np.float32)
    y = rng.random(n, dtype=np.float32)
    [scanned] = daemon.run(
        client, "accy.kernel.device_scan", 0, None, [Tensor("x", None, x.tobytes())],
        {"n": Scalar.u32(n)},
    )  # fmt: skip
    np.testing.assert_allclose(np.frombuffer(scanned.data, np.float32), np.cumsum(x), rtol=1e-4)
    session = daemon.load_pipeline(client, "accy.kernel.saxpy").session_id
    bx = daemon.allocate_buffer(client, x.nbytes, DType.F32).id
    by = daemon.allocate_buffer(client, y.nbytes, DType.F32).id
    for buffer_id, data in ((bx, x), (by, y)):
        with daemon.open_write(client, buffer_id) as transfer:
            transfer.write(0, data.tobytes())
    expected_y = y.copy()
    for step in range(6):
        a = np.float32(0.5 + step)
        if step % 2:
            daemon.launch(client, session, [by, by], [by], {"n": Scalar.u32(n), "a": Scalar.f32(a)})
            expected_y = a * expected_y + expected_y
        else:
            daemon.launch(client, session, [bx, by], [by], {"n": Scalar.u32(n), "a": Scalar.f32(a)})
            expected_y = a * x + expected_y
    got = np.frombuffer(daemon.open_read(client, by).read(0, y.nbytes), np.float32)
    np.testing.assert_allclose(got, expected_y, rtol=1e-5)
    daemon.close()
    assert backend.memory_in_use() == 0


def test_a_watched_launch_settles_or_notifies_once_its_work_finished() -> None:
    daemon, backend = host_daemon()
    client = daemon.attach().id
    n = 1 << 16
    session = daemon.load_pipeline(client, "accy.kernel.saxpy").session_id
    buffers = [daemon.allocate_buffer(client, n * 4, DType.F32).id for _ in range(2)]
    scalars = {"n": Scalar.u32(n), "a": Scalar.f32(2.0)}
    unwatched = daemon.launch(client, session, buffers, buffers[1:], scalars)
    assert unwatched.watch is None
    finished = threading.Event()
    ticket = daemon.launch(client, session, buffers, buffers[1:], scalars, watch=True)
    assert ticket.watch is not None
    assert ticket.watch.notify(finished.set)
    assert finished.wait(10)
    # The notification comes after the launch's mark, so waiting on it is over at once.
    assert ticket.watch.settle(0.001)
    ticket.watch.close()
    ticket.watch.close()  # idempotent
    assert not ticket.watch.settle(1.0) and not ticket.watch.notify(finished.set)
    daemon.wait_launch(client, session, ticket.launch_id)
    daemon.close()
    assert backend.memory_in_use() == 0


def test_run_without_attaching_is_held_to_the_callers_tenant_quotas() -> None:
    daemon, backend = host_daemon()
    x = np.ones(1024, np.float32)
    with pytest.raises(QuotaExceeded) as refused:
        daemon.run(
            None, "accy.kernel.device_scan", 0, None, [Tensor("x", None, x.tobytes())],
            {"n": Scalar.u32(x.size)}, tenant="team-a", quotas=Quotas(memory_bytes=1024),
        )  # fmt: skip
    assert refused.value.quota == "memory_bytes"
    status = daemon.status()
    assert (status.clients, status.buffers, status.device_memory_in_use) == (0, 0, 0)
    daemon.close()
    assert backend.memory_in_use() == 0
