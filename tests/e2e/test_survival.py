"""Clients survive their daemon: killed outright, or restarted after a device fault."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from accy import Client, Reattachment, errors
from accy.testing import running_daemon
from tests.e2e.flags import needs_flag, serve_help

SCAN, FAULT = "accy.kernel.device_scan", "accy.test.fault"
FAULTY_CATALOG = Path(__file__).resolve().parents[1] / "catalogs" / "faulty"
PATIENCE = 120.0  # a loaded machine can take many seconds to start a daemon


def _until(check: Callable[[], bool], what: str, timeout: float = PATIENCE) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _scan_ok(client: Client, n: int = 5000) -> None:
    """Fresh buffers on a (re)loaded scan session give the right answer."""
    x = np.random.default_rng(n).random(n, dtype=np.float32)
    session = client.load(SCAN)
    with client.buffer(x) as xb, client.empty(n, "f32") as yb:
        session.launch([xb], [yb], n=n)
        np.testing.assert_allclose(yb.read(), np.cumsum(x, dtype=np.float64), rtol=1e-4)


def test_client_survives_a_killed_daemon() -> None:
    with running_daemon(tcp=False) as daemon:
        seen: list[Reattachment] = []
        with Client(
            daemon.unix_target, reattach_timeout=PATIENCE, on_reattach=seen.append
        ) as client:
            n = 4096
            data = np.random.default_rng(1).random(n, dtype=np.float32)
            session = client.load(SCAN)
            session.allocate_intermediates(n=n)
            x, y = client.buffer(data), client.empty(n, "f32")
            session.launch([x], [y], n=n)
            first, old_session = client.attachment, session.id

            daemon.restart()  # SIGKILL: no drain, no goodbye
            _until(lambda: client.reattachments == 1, "the client to reattach")

            record = seen[0]
            assert record.restarted and record.previous == first
            assert record.attachment.instance_id != first.instance_id
            assert (record.sessions_restored, record.buffers_lost) == (1, 2)
            with pytest.raises(errors.BufferLost, match="was lost when the daemon restarted"):
                y.read()
            with pytest.raises(errors.BufferLost):
                session.launch([x], [y], n=n)
            x.free()  # a no-op on a lost buffer
            assert session.id != old_session
            with client.buffer(data) as x2, client.empty(n, "f32") as y2:
                session.launch([x2], [y2], n=n)  # the reloaded session, its scratch reallocated
                np.testing.assert_allclose(y2.read(), np.cumsum(data, dtype=np.float64), rtol=1e-4)
                status = client.status()
                assert status.my_sessions == 1 and status.my_buffers == 2
            session.release()


@needs_flag("--no-supervise")
def test_device_fault_names_the_session_and_clients_come_back() -> None:
    """A faulting launch: DEVICE_LOST naming its session; the supervisor restarts the daemon."""
    with running_daemon(tcp=False, extra=("--catalog", str(FAULTY_CATALOG))) as daemon:
        with (
            Client(daemon.unix_target, client_name="culprit", reattach_timeout=PATIENCE) as bad,
            Client(daemon.unix_target, client_name="bystander", reattach_timeout=PATIENCE) as good,
        ):
            _scan_ok(good)
            kept = good.buffer(np.ones(16, np.float32))
            faulty = bad.load(FAULT)
            faulted_id = faulty.id  # the session gets a new id when it is reloaded
            with bad.buffer(np.ones(16, np.float32)) as x, bad.empty(16, "f32") as y:
                started = time.monotonic()
                with pytest.raises(errors.Unavailable) as caught:
                    faulty.launch([x], [y], n=16)
            assert caught.value.reason == "DEVICE_LOST"
            assert caught.value.session == faulted_id

            _until(lambda: good.reattachments == 1, "the bystander to reattach")
            recovered = time.monotonic() - started
            assert daemon.process.poll() is None, "the supervisor should still run"
            with pytest.raises(errors.BufferLost):
                kept.read()
            _scan_ok(good)
            _until(lambda: bad.reattachments == 1, "the culprit to reattach")
            assert bad.last_reattachment is not None
            assert bad.last_reattachment.fault_session == faulted_id
            _scan_ok(bad)
            assert good.status().restarts >= 1
        print(f"fault to a reattached client with right results: {recovered:.2f} s")


def test_device_fault_without_a_supervisor() -> None:
    """Unsupervised, the daemon exits 75; a new one (as a container restart) is reattached to."""
    flags = ["--catalog", str(FAULTY_CATALOG)]
    if "--no-supervise" in serve_help():
        flags.append("--no-supervise")
    with (
        running_daemon(tcp=False, extra=tuple(flags)) as daemon,
        Client(daemon.unix_target, reattach_timeout=PATIENCE) as client,
    ):
        scan = client.load(SCAN)
        faulty = client.load(FAULT)
        with client.buffer(np.ones(16, np.float32)) as x, client.empty(16, "f32") as y:
            with pytest.raises(errors.Unavailable) as caught:
                faulty.launch([x], [y], n=16)
            assert caught.value.reason == "DEVICE_LOST"
            assert caught.value.session == faulty.id
            with pytest.raises(errors.BufferLost, match="lost its device to a fault"):
                x.read()
        assert daemon.process.wait(timeout=60) == 75
        daemon.start()
        _until(lambda: client.reattachments == 1, "the client to reattach")
        _scan_ok(client)
        assert scan.id == client.load(SCAN).id  # the reloaded session, found again


def test_the_faulting_launch_names_its_session() -> None:
    """The client's error, and the buffers lost with it, name the session that faulted."""
    extra = ("--catalog", str(FAULTY_CATALOG), "--no-supervise")
    with (
        running_daemon(tcp=False, extra=extra) as daemon,
        Client(daemon.unix_target, reattach_timeout=0) as client,
    ):
        faulty = client.load(FAULT)
        x, y = client.buffer(np.ones(16, np.float32)), client.empty(16, "f32")
        with pytest.raises(errors.Unavailable) as caught:
            faulty.launch([x], [y], n=16)
        with pytest.raises(errors.BufferLost) as lost:
            x.read()
        assert lost.value.session == faulty.id
        assert caught.value.session == faulty.id


def test_an_idle_client_that_pings_keeps_what_it_holds() -> None:
    """Liveness detaches only the silent: the library's ping thread keeps an idle client."""
    with (
        running_daemon(tcp=False) as daemon,
        Client(daemon.unix_target, liveness=1) as client,
    ):
        session = client.load(SCAN)
        kept = client.buffer(np.arange(16, dtype=np.float32))
        time.sleep(3)  # three liveness periods without a call of the user's own
        status = client.status()
        assert (status.my_sessions, status.my_buffers) == (1, 1)
        assert client.reattachments == 0
        np.testing.assert_array_equal(kept.read(), np.arange(16, dtype=np.float32))
        session.release()


def test_calls_racing_a_restart_wait_for_the_new_daemon() -> None:
    """Calls made in a hot loop while the daemon is killed and started again each succeed:
    one that finds the daemon gone waits (within its timeout) for the client to reattach."""
    with (
        running_daemon(tcp=False) as daemon,
        Client(daemon.unix_target, reattach_timeout=PATIENCE, timeout=PATIENCE) as client,
    ):
        failures: list[BaseException] = []
        answered = 0
        stop = threading.Event()

        def hammer() -> None:
            nonlocal answered
            while not stop.is_set():
                try:
                    client.status()
                    answered += 1
                except errors.AccyError as error:
                    failures.append(error)

        threads = [threading.Thread(target=hammer) for _ in range(4)]
        for thread in threads:
            thread.start()
        try:
            _until(lambda: answered > 20, "calls before the restart")
            daemon.restart()
            _until(lambda: client.reattachments == 1, "the client to reattach")
            before = answered
            _until(lambda: answered > before + 20, "calls after the restart")
        finally:
            stop.set()
            for thread in threads:
                thread.join(PATIENCE)
        assert failures == []
