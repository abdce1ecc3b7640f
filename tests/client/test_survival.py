"""The client survives its daemon: it reattaches, reloads sessions, reports lost buffers."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from accy import Reattachment, errors
from accy.client import Client
from tests.client.fake_daemon import FakeLaunchService, until

SCAN = "accy.kernel.device_scan"


@pytest.fixture
def watched(fake: tuple[str, FakeLaunchService]) -> Iterator[tuple[Client, list[Reattachment]]]:
    """A client that records each reattachment."""
    seen: list[Reattachment] = []
    with Client(fake[0], client_name="survivor", on_reattach=seen.append) as client:
        yield client, seen


def test_restart_reloads_sessions_and_loses_buffers(
    fake: tuple[str, FakeLaunchService], watched: tuple[Client, list[Reattachment]]
) -> None:
    client, seen = watched
    service = fake[1]
    first = client.attachment
    session = client.load(SCAN)
    session.allocate_intermediates(n=8)
    released = client.load(SCAN)
    released.release()
    x, y = client.buffer(np.arange(8, dtype=np.float32)), client.empty(8, "f32")
    session.launch([x], [y], n=8)
    old_id = session.id

    service.restart()
    # the count moves before on_reattach is called (on the reattaching thread): wait for both
    until(lambda: client.reattachments == 1 and len(seen) == 1)
    assert client.attachment.instance_id == "i2" and len(seen) == 1
    record = seen[0]
    assert record.restarted and record.why == "the daemon restarted"
    assert (record.sessions_restored, record.sessions_lost, record.buffers_lost) == (1, 0, 2)
    assert record.previous == first and record.attachment.client_id == client.client_id
    assert client.client_id != first.client_id and client.client_id in service.state.clients
    # The session was loaded again, with its scratch for the same scalars.
    assert session.id != old_id and session.id in service.state.sessions
    assert len(service.state.sessions) == 1  # the released one was not brought back
    (scratch,) = service.state.scratch
    assert scratch.session_id == session.id and scratch.runtime_scalars["n"].u32 == 8
    # Old buffers: every use is refused locally, freeing them is a no-op.
    assert x.lost and "lost" in repr(x)
    with pytest.raises(
        errors.BufferLost, match=f"buffer {x.id} was lost when the daemon restarted"
    ):
        x.read()
    with pytest.raises(errors.BufferLost):
        y.write(np.zeros(8, np.float32))
    with pytest.raises(errors.BufferLost) as caught:
        session.launch([x], [y], n=8)
    assert caught.value.buffer_id == x.id and isinstance(caught.value, errors.DataLoss)
    assert not service.state.launches  # nothing reached the daemon
    x.free()
    y.free()
    # New buffers on the reloaded session give right results.
    data = np.random.default_rng(0).random(8, dtype=np.float32)
    with client.buffer(data) as x2, client.empty(8, "f32") as y2:
        session.launch([x2], [y2], n=8)
        np.testing.assert_allclose(y2.read(), np.cumsum(data), rtol=1e-6)
    session.release()
    assert not service.state.sessions


def test_device_fault_names_the_session_then_recovers(
    fake: tuple[str, FakeLaunchService], watched: tuple[Client, list[Reattachment]]
) -> None:
    client, seen = watched
    service = fake[1]
    session = client.load(SCAN)
    x, y = client.buffer(np.ones(4, np.float32)), client.empty(4, "f32")
    pending = session.launch([x], [y], wait=False, n=4)

    service.fault("ses_culprit")
    with pytest.raises(errors.Unavailable) as caught:
        session.launch([x], [y], n=4)
    assert caught.value.reason == "DEVICE_LOST" and caught.value.session == "ses_culprit"
    # The buffers are known lost at once, naming the fault.
    with pytest.raises(errors.BufferLost) as lost:
        x.read()
    assert "lost its device to a fault in session ses_culprit" in str(lost.value)
    assert lost.value.session == "ses_culprit"
    # The launch still pending on the lost daemon reports the fault.
    with pytest.raises(errors.Unavailable) as gone:
        pending.wait()
    assert gone.value.reason == "DEVICE_LOST" and gone.value.session == "ses_culprit"
    with pytest.raises(errors.Unavailable):
        session.wait()  # once: the work enqueued on the lost daemon
    assert not client.attached

    service.restart()
    until(lambda: client.reattachments == 1 and len(seen) == 1)
    assert seen[0].fault_session == "ses_culprit" and seen[0].restarted
    with client.buffer(np.ones(4, np.float32)) as x2, client.empty(4, "f32") as y2:
        session.launch([x2], [y2], n=4)
        np.testing.assert_array_equal(y2.read(), [1, 2, 3, 4])
    session.wait()


def test_an_answer_on_its_way_when_the_link_is_lost_still_reaches_its_caller(
    fake: tuple[str, FakeLaunchService], watched: tuple[Client, list[Reattachment]]
) -> None:
    # A stopping daemon answers launches in flight (a device fault naming its session,
    # say) as its Attach streams end; the client must not drop those answers for a
    # vaguer "lost when the daemon detached this client".
    client, _ = watched
    service = fake[1]
    session = client.load(SCAN)
    x, y = client.buffer(np.ones(4, np.float32)), client.empty(4, "f32")
    service.answer_delay = 0.4
    launched: list[object] = []
    launching = threading.Thread(
        target=lambda: launched.append(session.launch([x], [y], n=4)), daemon=True
    )
    launching.start()
    until(lambda: bool(service.state.launch_ids))  # done; its answer is on its way
    service.end_attach_streams()
    until(lambda: client.reattachments == 1)
    launching.join(timeout=5)
    (launch,) = launched
    assert launch.id == service.state.launch_ids[0]  # type: ignore[attr-defined]
    service.answer_delay = 0.0
    # The stream went with the link; the next launch opens one on the new link.
    with client.buffer(np.ones(4, np.float32)) as x2, client.empty(4, "f32") as y2:
        session.launch([x2], [y2], n=4)
        np.testing.assert_array_equal(y2.read(), [1, 2, 3, 4])


def test_faulted_instance_is_not_attached_again(
    fake: tuple[str, FakeLaunchService], watched: tuple[Client, list[Reattachment]]
) -> None:
    client, _ = watched
    service = fake[1]
    service.fault("ses_x")
    with pytest.raises(errors.Unavailable):
        client.status()
    service.fault_session = None  # the same instance answers again: its device is still bad
    time.sleep(0.3)
    assert not client.attached and client.reattachments == 0
    service.restart()
    until(lambda: client.reattachments == 1)
    assert client.wait_attached(1).instance_id == "i2"


def test_calls_wait_while_the_client_reattaches(
    fake: tuple[str, FakeLaunchService], watched: tuple[Client, list[Reattachment]]
) -> None:
    client, _ = watched
    service = fake[1]
    service.refuse_attach = True
    service.restart()
    until(lambda: not client.attached)
    threading.Timer(0.3, lambda: setattr(service, "refuse_attach", False)).start()
    started = time.monotonic()
    assert client.status().instance_id == "i2"
    assert time.monotonic() - started >= 0.2
    assert client.reattachments == 1


def test_a_client_the_daemon_forgot_attaches_again_and_retries(
    fake: tuple[str, FakeLaunchService], watched: tuple[Client, list[Reattachment]]
) -> None:
    client, seen = watched
    session = client.load(SCAN)
    fake[1].state.clients.clear()  # the daemon dropped this client; its stream still open
    assert client.status().serving  # refused as unknown, reattached, made again
    assert client.reattachments == 1
    assert not seen[0].restarted and seen[0].why == "the daemon detached this client"
    assert session.id in fake[1].state.sessions


def test_gives_up_after_reattach_timeout(fake: tuple[str, FakeLaunchService]) -> None:
    target, service = fake
    with Client(target, reattach_timeout=0.5) as client:
        service.refuse_attach = True
        service.restart()
        started = time.monotonic()
        with pytest.raises(errors.Unavailable) as caught:
            client.status()
        assert caught.value.reason == "REATTACH_FAILED"
        assert "could not attach again within 0.5 s" in str(caught.value)
        assert time.monotonic() - started < 5
        with pytest.raises(errors.Unavailable):
            client.load(SCAN)
        with pytest.raises(errors.Unavailable):
            client.wait_attached(1)


def test_reattach_off(fake: tuple[str, FakeLaunchService]) -> None:
    target, service = fake
    with Client(target, reattach_timeout=0) as client:
        buffer = client.empty(4, "f32")
        service.restart()
        with pytest.raises(errors.Unavailable, match="reattaching is off"):
            client.status()
        assert client.reattachments == 0
        with pytest.raises(errors.BufferLost):
            buffer.read()


def test_wait_attached_times_out(fake: tuple[str, FakeLaunchService]) -> None:
    target, service = fake
    with Client(target) as client:
        service.refuse_attach = True
        service.restart()
        until(lambda: not client.attached)
        with pytest.raises(errors.DeadlineExceeded):  # accy's own, not the built-in
            client.wait_attached(0.2)


def test_threads_keep_working_across_restarts(fake: tuple[str, FakeLaunchService]) -> None:
    """Four threads launch and check while the daemon restarts twice under them."""
    target, service = fake
    stop = threading.Event()
    failures: list[str] = []
    good = [0] * 4

    with Client(target) as client:

        def work(index: int) -> None:
            rng = np.random.default_rng(index)
            session = client.load(SCAN)
            x = y = None
            while not stop.is_set():
                data = rng.random(64, dtype=np.float32)
                try:
                    if x is None or y is None or x.lost:
                        x, y = client.empty(64, "f32"), client.empty(64, "f32")
                    x.write(data)
                    session.launch([x], [y], n=64)
                    np.testing.assert_allclose(y.read(), np.cumsum(data), rtol=1e-5)
                    good[index] += 1
                except (errors.BufferLost, errors.Unavailable):
                    continue  # the daemon went away under this step; the next one rebuilds
                except Exception as error:
                    failures.append(f"thread {index}: {type(error).__name__}: {error}")
                    return

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for count in (1, 2):
            time.sleep(0.3)
            service.restart()
            until(lambda n=count: client.reattachments == n)
        time.sleep(0.3)
        before = list(good)
        time.sleep(0.3)
        stop.set()
        for thread in threads:
            thread.join(10)
    assert not failures, failures
    assert client.reattachments == 2
    assert all(after > then for after, then in zip(good, before, strict=True)), (good, before)


def test_callback_errors_do_not_stop_the_client(fake: tuple[str, FakeLaunchService]) -> None:
    def explode(record: Reattachment) -> None:
        raise RuntimeError("callback bug")

    with Client(fake[0], on_reattach=explode) as client:
        fake[1].restart()
        until(lambda: client.reattachments == 1)
        assert client.status().serving


def test_close_while_reattaching_returns_promptly(fake: tuple[str, FakeLaunchService]) -> None:
    target, service = fake
    client = Client(target, reattach_timeout=None)
    service.refuse_attach = True
    service.restart()
    until(lambda: not client.attached)
    started = time.monotonic()
    client.close()
    assert time.monotonic() - started < 3
    assert not client._attacher.alive
    with pytest.raises(RuntimeError, match="closed"):
        client.status()
