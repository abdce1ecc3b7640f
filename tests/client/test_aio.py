"""``accy.aio`` against a real daemon (host backend): many launches awaited at once from one
event loop, a wait cancelled midway, and the blocking client's errors for the same mistakes."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from accy.aio import AsyncBuffer, AsyncClient, AsyncLaunch, AsyncSession
from accy.aio import _ring as aio_ring
from accy.client import Client
from accy.errors import AccyError, ClientClosed, Unavailable
from accy.protocol.ring import RING_ENV
from accy.testing import RunningDaemon, running_daemon
from tests.waiting import eventually

SLOW_CATALOG = Path(__file__).parents[1] / "catalogs" / "slow"
SAXPY = "accy.kernel.saxpy"
SLOW = "accy.test.slow"


@pytest.fixture(scope="module")
def daemon() -> Iterator[RunningDaemon]:
    """``accyd serve --backend host`` with the built-in catalog and the slow pipeline."""
    with running_daemon(backend="host", tcp=False, extra=["--catalog", str(SLOW_CATALOG)]) as d:
        yield d
        assert d.process.poll() is None, f"accyd died during the tests:\n{d.log_text()}"


@pytest.fixture(params=["ring", "calls"])
def way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How launches go: through the same-host ring, or as unary calls (``ACCY_RING=0``)."""
    if request.param == "calls":
        monkeypatch.setenv(RING_ENV, "0")
    return str(request.param)


def daemon_holds(target: str) -> tuple[int, int, int]:
    """(clients, sessions, buffers) the daemon holds for everyone, asked by a client of its
    own (counted among the clients): (1, 0, 0) once a closed client's detach is over."""
    with Client(target, client_name="observer") as observer:
        status = observer.status()
        return status.clients, status.sessions, status.buffers


def test_a_hundred_launches_awaited_at_once_from_one_loop(daemon: RunningDaemon, way: str) -> None:
    n = 256
    x = np.arange(n, dtype=np.float32)
    y = np.full(n, 3.0, dtype=np.float32)

    async def main() -> list[np.ndarray[Any, Any]]:
        async with AsyncClient(daemon.unix_target) as client:
            xb, yb = await client.buffer(x), await client.buffer(y)
            outs = await asyncio.gather(*(client.empty(n, "f32") for _ in range(100)))
            async with await client.load(SAXPY) as session:
                launches = await asyncio.gather(
                    *(
                        session.launch([xb, yb], [out], n=n, a=float(i))
                        for i, out in enumerate(outs)
                    )
                )
                assert all(launch.completed for launch in launches)
                names = {launch.record if way == "ring" else launch.id for launch in launches}
                assert None not in names and len(names) == 100
                return list(await asyncio.gather(*(out.read() for out in outs)))

    results = asyncio.run(main())
    for i, got in enumerate(results):
        np.testing.assert_array_equal(got, np.float32(i) * x + y)
    # everything went with the client
    assert eventually(lambda: daemon_holds(daemon.unix_target) == (1, 0, 0), step=0.05)


def test_launches_without_waiting_then_awaited(daemon: RunningDaemon, way: str) -> None:
    x = np.arange(8, dtype=np.float32)

    async def main() -> np.ndarray[Any, Any]:
        async with AsyncClient(daemon.unix_target) as client:
            xb, yb = await client.buffer(x), await client.buffer(x)
            session = await client.load(SAXPY)
            first = await session.launch([xb, yb], [yb], wait=False, n=8, a=1.0)
            await session.launch([xb, yb], [yb], wait=False, n=8, a=1.0)
            assert (await first.wait()).completed
            await session.wait()
            got = await yb.read()
            await session.release()
            await session.release()  # idempotent
            return got

    np.testing.assert_array_equal(asyncio.run(main()), 3 * x)


def test_a_wait_cancelled_midway_leaks_nothing_and_the_client_goes_on(
    daemon: RunningDaemon, way: str
) -> None:
    x = np.arange(4, dtype=np.float32)

    async def main() -> None:
        async with AsyncClient(daemon.unix_target) as client:
            xb, yb = await client.buffer(x), await client.empty(4, "f32")
            session = await client.load(SLOW)
            # a launch awaited with wait=True, cancelled while the daemon runs it
            task = asyncio.create_task(session.launch([xb], [yb], n=4, ms=1500))
            await asyncio.sleep(0.3)
            started = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert time.monotonic() - started < 0.5  # the loop was never blocked
            # a launch's own wait, cancelled midway
            enqueued = await session.launch([xb], [yb], wait=False, n=4, ms=800)
            waiting = asyncio.create_task(enqueued.wait())
            await asyncio.sleep(0.1)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert not enqueued.completed
            # the work itself ran to its end, and the client goes on as before
            await (await enqueued.wait()).wait()
            np.testing.assert_array_equal(await yb.read(), x)
            status = await client.status()
            assert (status.my_sessions, status.my_buffers) == (1, 2)
            await session.release()
            await xb.free()
            await yb.free()
            status = await client.status()
            assert (status.my_sessions, status.my_buffers) == (0, 0)
            (ran,) = await client.run(SAXPY, x, x, a=2.0)
            np.testing.assert_array_equal(ran, 3 * x)
        assert client.closed
        with pytest.raises(ClientClosed):
            await client.status()
        left = [task for task in asyncio.all_tasks() if task.get_name().startswith("accy-aio")]
        assert not left  # its Attach reader and pinger ended with it

    asyncio.run(main())
    assert eventually(lambda: daemon_holds(daemon.unix_target) == (1, 0, 0), step=0.05)


# -- the same mistakes, the same errors ------------------------------------------------------

Mistake = Callable[[Any, Any, Any, Any], Any]
"""``mistake(client, session, x, out)``: one wrong use, for either client (awaited if async)."""

MISTAKES: dict[str, Mistake] = {
    "launch: too few operands": lambda c, s, x, out: s.launch([x], [out], n=4, a=1.0),
    "launch: too many results": lambda c, s, x, out: s.launch([x, x], [out, out], n=4, a=1.0),
    "launch: a numpy array for a buffer": lambda c, s, x, out: s.launch(
        [np.zeros(4, np.float32), x], [out], n=4, a=1.0
    ),
    "launch: scalar below its type": lambda c, s, x, out: s.launch([x, x], [out], n=-1, a=1.0),
    "launch: scalar past its type": lambda c, s, x, out: s.launch([x, x], [out], n=2**32, a=1.0),
    "launch: scalar past the pipeline's bound": lambda c, s, x, out: s.launch(
        [x, x], [out], n=2**31, a=1.0
    ),
    "launch: scalar past the buffers": lambda c, s, x, out: s.launch([x, x], [out], n=5, a=1.0),
    "launch: scalar missing": lambda c, s, x, out: s.launch([x, x], [out], n=4),
    "launch: scalar unknown": lambda c, s, x, out: s.launch([x, x], [out], n=4, a=1.0, b=2),
    "launch: float for an integer": lambda c, s, x, out: s.launch([x, x], [out], n=4.0, a=1.0),
    "intermediates: scalar unknown": lambda c, s, x, out: s.allocate_intermediates(m=1),
    "load: unknown pipeline": lambda c, s, x, out: c.load("accy.kernel.nothing"),
    "load: unknown version": lambda c, s, x, out: c.load(SAXPY, 99),
    "run: unknown pipeline": lambda c, s, x, out: c.run("accy.kernel.nothing", np.ones(4)),
    "run: wrong operand count": lambda c, s, x, out: c.run(SAXPY, np.ones(4, np.float32)),
    "run: wrong dtype": lambda c, s, x, out: c.run(SAXPY, np.ones(4), np.ones(4), a=1.0),
    "run: scalar out of bounds": lambda c, s, x, out: c.run(
        SAXPY, np.ones(4, np.float32), np.ones(4, np.float32), a=1e39
    ),
    "buffer: negative size": lambda c, s, x, out: c.buffer(-1),
    "write: wrong dtype": lambda c, s, x, out: x.write(np.ones(4)),
    "write: past the end": lambda c, s, x, out: x.write(np.ones(4, np.float32), 4),
    "read: past the end": lambda c, s, x, out: x.read(count=5),
    "read: out of another size": lambda c, s, x, out: x.read(count=3, out=np.empty(4, np.float32)),
}


def blocking_error(target: str, mistake: Mistake) -> tuple[str, AccyError]:
    with Client(target) as client:
        x = client.buffer(np.ones(4, np.float32))
        out = client.empty(4, "f32")
        session = client.load(SAXPY)
        with pytest.raises(AccyError) as caught:
            mistake(client, session, x, out)
        return _ids_out(caught.value, session.id, x.id, out.id)


def async_error(target: str, mistake: Mistake) -> tuple[str, AccyError]:
    async def main() -> tuple[str, AccyError]:
        async with AsyncClient(target) as client:
            x: AsyncBuffer = await client.buffer(np.ones(4, np.float32))
            out: AsyncBuffer = await client.empty(4, "f32")
            session: AsyncSession = await client.load(SAXPY)
            with pytest.raises(AccyError) as caught:
                made = mistake(client, session, x, out)
                assert isinstance(made, Awaitable), "an accy.aio call that is not awaitable"
                await made
            return _ids_out(caught.value, session.id, x.id, out.id)

    return asyncio.run(main())


def _ids_out(error: AccyError, *ids: str) -> tuple[str, AccyError]:
    """The error's text with this client's own ids in it named by role (they differ)."""
    text = re.sub(r"ring record \d+", "ring record <n>", str(error))  # binds come first
    for role, one in zip(("<session>", "<x>", "<out>"), ids, strict=True):
        text = text.replace(one, role)
    return text, error


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_a_mistake_raises_what_the_blocking_client_raises(
    daemon: RunningDaemon, way: str, mistake: str
) -> None:
    """The same class, message, reason and fields, whichever way both launch: through the
    same-host ring (its refusals name the record), or by calls (``ACCY_RING=0``)."""
    wrong = MISTAKES[mistake]
    blocking_text, blocking = blocking_error(daemon.unix_target, wrong)
    async_text, raised = async_error(daemon.unix_target, wrong)
    assert type(raised) is type(blocking)
    assert async_text == blocking_text
    assert (raised.reason, raised.fields) == (blocking.reason, blocking.fields)


def test_a_freed_buffer_and_a_released_session_say_so_as_the_blocking_ones_do(
    daemon: RunningDaemon, way: str
) -> None:
    def blocking() -> list[str]:
        with Client(daemon.unix_target) as client:
            x = client.buffer(np.ones(4, np.float32))
            session = client.load(SAXPY)
            x.free()
            session.release()
            said = []
            for wrong in (lambda: x.read(), lambda: session.launch([x, x], [x], n=4, a=1.0)):
                with pytest.raises(AccyError) as caught:
                    wrong()
                said.append(_ids_out(caught.value, session.id, x.id, "-")[0])
            return said

    async def awaited() -> list[str]:
        async with AsyncClient(daemon.unix_target) as client:
            x = await client.buffer(np.ones(4, np.float32))
            session = await client.load(SAXPY)
            await x.free()
            await session.release()
            said = []
            for wrong in (lambda: x.read(), lambda: session.launch([x, x], [x], n=4, a=1.0)):
                with pytest.raises(AccyError) as caught:
                    await wrong()
                said.append(_ids_out(caught.value, session.id, x.id, "-")[0])
            return said

    assert asyncio.run(awaited()) == blocking()


def test_an_unopened_client_says_how_to_open_it() -> None:
    async def main() -> None:
        client = AsyncClient("unix:/nonexistent/accy.sock")
        with pytest.raises(ClientClosed, match="async with AsyncClient"):
            await client.status()

    asyncio.run(main())


def test_a_ring_wait_is_woken_by_the_daemon_not_by_looking_again(
    daemon: RunningDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Waits sleep on the ring's ``complete`` eventfd, watched by the loop: with the look
    made once every 5 s, 50 waited launches still take well under one look."""
    monkeypatch.setattr(aio_ring, "LOOK_EVERY", 5.0)

    async def main() -> float:
        async with AsyncClient(daemon.unix_target) as client:
            x, out = await client.buffer(np.ones(16, np.float32)), await client.empty(16, "f32")
            session = await client.load(SAXPY)
            first = await session.launch([x, x], [out], n=16, a=1.0)
            assert first.record is not None  # through the ring
            started = time.monotonic()
            for _ in range(50):
                await session.launch([x, x], [out], n=16, a=1.0)
            return time.monotonic() - started

    assert asyncio.run(main()) < 4.0


def test_a_refusal_nobody_waited_for_is_raised_where_the_blocking_client_raises_it(
    daemon: RunningDaemon, way: str
) -> None:
    def blocking() -> str:
        with Client(daemon.unix_target) as client:
            x, out = client.buffer(np.ones(4, np.float32)), client.empty(4, "f32")
            session = client.load(SAXPY)
            with pytest.raises(AccyError) as caught:  # a call's refusal: at the launch
                session.launch([x, x], [out], wait=False, n=5, a=1.0)  # past the buffers
                session.wait()
            session.launch([x, x], [out], n=4, a=1.0)  # reported once: the session goes on
            return _ids_out(caught.value, session.id, x.id, out.id)[0]

    async def awaited() -> str:
        async with AsyncClient(daemon.unix_target) as client:
            x, out = await client.buffer(np.ones(4, np.float32)), await client.empty(4, "f32")
            session = await client.load(SAXPY)
            try:
                await session.launch([x, x], [out], wait=False, n=5, a=1.0)
                await session.wait()
            except AccyError as error:
                said = _ids_out(error, session.id, x.id, out.id)[0]
            else:
                raise AssertionError("the refusal was not raised")
            await session.launch([x, x], [out], n=4, a=1.0)
            return said

    said = asyncio.run(awaited())
    assert said == blocking()
    assert ("ring record <n> was refused" in said) == (way == "ring")


def test_launches_are_calls_where_the_daemon_offers_no_ring() -> None:
    with running_daemon(backend="host", tcp=False, extra=["--no-rings"]) as daemon:

        async def main() -> AsyncLaunch:
            async with AsyncClient(daemon.unix_target) as client:
                x, out = await client.buffer(np.ones(4, np.float32)), await client.empty(4, "f32")
                session = await client.load(SAXPY)
                launch = await session.launch([x, x], [out], n=4, a=2.0)
                np.testing.assert_array_equal(await out.read(), np.full(4, 3, np.float32))
                return launch

        launch = asyncio.run(main())
    assert launch.id is not None and launch.record is None


def test_a_client_whose_daemon_went_away_says_so_and_does_not_hang(tmp_path: Path) -> None:
    with running_daemon(backend="host", tcp=False) as daemon:

        async def main() -> None:
            async with AsyncClient(daemon.unix_target, timeout=10) as client:
                session = await client.load(SAXPY)
                x = await client.buffer(np.ones(4, np.float32))
                await session.launch([x, x], [x], n=4, a=1.0)
                await asyncio.to_thread(daemon.stop)
                started = time.monotonic()
                with pytest.raises(Unavailable):
                    await session.launch([x, x], [x], n=4, a=1.0)
                with pytest.raises(Unavailable) as caught:
                    await client.status()
                assert "make a new AsyncClient" in caught.value.message
                assert not client.attached
                assert time.monotonic() - started < 5

        asyncio.run(main())


def test_a_buffer_and_a_session_dropped_unfreed_are_freed_in_the_background(
    daemon: RunningDaemon, way: str
) -> None:
    async def main() -> None:
        async with AsyncClient(daemon.unix_target) as client:
            x = await client.buffer(np.ones(4, np.float32))
            session = await client.load(SAXPY)
            await session.launch([x, x], [x], n=4, a=1.0)
            kept = await client.empty(4, "f32")
            del x, session
            gc.collect()
            for _ in range(200):
                status = await client.status()
                if (status.my_sessions, status.my_buffers) == (0, 1):
                    break
                await asyncio.sleep(0.01)
            assert (status.my_sessions, status.my_buffers) == (0, 1)
            await kept.free()

    asyncio.run(main())


def test_a_scan_with_scratch_and_reads_into_an_array(daemon: RunningDaemon, way: str) -> None:
    n = 10_000
    x = np.random.default_rng(7).random(n, dtype=np.float32)
    got = np.empty(n, np.float32)
    seen: list[tuple[int, int]] = []

    async def main() -> np.ndarray[Any, Any]:
        async with AsyncClient(daemon.unix_target, chunk_size=16 << 10) as client:
            xs = await client.empty(n, "f32")
            await xs.write(x[: n // 2])
            await xs.write(
                x[n // 2 :], 4 * (n // 2), progress=lambda done, _: seen.append((done, _))
            )
            ys = await client.empty(n, "f32")
            async with await client.load("accy.kernel.device_scan") as scan:
                assert await scan.allocate_intermediates(n=n) > 0
                await scan.launch([xs], [ys], n=n)
            assert await ys.read(out=got) is got
            return await xs.read(offset=4 * 10, count=5)

    part = asyncio.run(main())
    np.testing.assert_allclose(got, np.cumsum(x, dtype=np.float64), rtol=1e-4)
    np.testing.assert_array_equal(part, x[10:15])
    assert seen[-1] == (2 * n, 2 * n) and len(seen) > 1  # bytes, chunk by chunk


def test_launches_cancelled_as_the_ring_opens_leave_no_descriptor_behind(
    daemon: RunningDaemon,
) -> None:
    async def main(cancel_after: int) -> None:
        async with AsyncClient(daemon.unix_target) as client:
            x = await client.buffer(np.ones(4, np.float32))
            session = await client.load(SAXPY)
            task = asyncio.create_task(session.launch([x, x], [x], n=4, a=1.0))
            for _ in range(cancel_after):  # cancelled at each step on the way to its record,
                await asyncio.sleep(0)  # the ring's handoff (on a thread) among them
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await session.launch([x, x], [x], n=4, a=1.0)

    asyncio.run(main(0))  # gRPC's own descriptors, made once per process
    gc.collect()
    before = len(os.listdir("/proc/self/fd"))
    for steps in range(1, 40):
        asyncio.run(main(steps))

    def settled() -> bool:
        gc.collect()
        return len(os.listdir("/proc/self/fd")) <= before

    # gRPC closes a finished channel's socket and poller (an epoll and an eventfd) on its own
    # threads a moment later; a leaked ring (two eventfds and a map) stays however long we wait.
    assert eventually(settled, timeout=10.0, step=0.05), (
        f"{len(os.listdir('/proc/self/fd'))} descriptors open, {before} before"
    )
