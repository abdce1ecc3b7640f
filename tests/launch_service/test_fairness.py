"""One client's waits and queued work never hold up another tenant's calls (host backend)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import numpy as np
import pytest

from accy import Client
from accy.protocol.launch.v1 import launch_pb2 as pb
from accyd.catalog import load_catalog
from tests.launch_service.harness import ServerThread, chunks, make_config
from tests.security.harness import Caller, TokenSpec, write_tokens

SLOW = "accy.test.slow"
SAXPY = "accy.kernel.saxpy"
CATALOG = load_catalog([Path(__file__).parents[1] / "catalogs" / "slow"])
PROMPT = 0.5
"""Seconds within which each call of the other tenant must be answered."""
_T = TypeVar("_T")


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ServerThread, dict[str, str]]]:
    folder = tmp_path_factory.mktemp("fairness")
    specs = {"a": TokenSpec("team-a"), "b": TokenSpec("team-b")}
    tokens = write_tokens(folder / "tokens.toml", specs)
    config = make_config(folder, "unix", tokens_file=folder / "tokens.toml", blocking_threads=8)
    running = ServerThread(config, catalog=CATALOG)
    yield running, tokens
    running.stop()


def u32(value: int) -> pb.Scalar:
    return pb.Scalar(u32=value)


def queue_slow_work(caller: Caller, launches: int, ms: int) -> tuple[str, list[str]]:
    """Load the slow pipeline and queue ``launches`` of ``ms`` each; the session and launch ids."""
    session = caller.load(SLOW)
    x, y = caller.buffer(16), caller.buffer(16)
    scalars = {"n": u32(4), "ms": u32(ms)}
    request = pb.LaunchRequest(
        session_id=session, operands=[x], results=[y], runtime_scalars=scalars
    )
    return session, [caller.Launch(request).launch_id for _ in range(launches)]


def wait_many(caller: Caller, session: str, launch_id: str, count: int) -> list[Any]:
    request = pb.WaitLaunchRequest(session_id=session, launch_id=launch_id)
    return [
        caller.stub.WaitLaunch.future(request, metadata=caller.metadata, timeout=60)
        for _ in range(count)
    ]


def prompt(calls: list[tuple[str, float]], name: str, call: Callable[[], _T]) -> _T:
    started = time.perf_counter()
    result = call()
    calls.append((name, time.perf_counter() - started))
    return result


def test_a_clients_waits_do_not_starve_another_tenant(
    served: tuple[ServerThread, dict[str, str]],
) -> None:
    server, tokens = served
    with grpc.insecure_channel(server.address) as channel:
        a, b = Caller(channel, tokens["a"]), Caller(channel, tokens["b"])
        a.attach("a")
        b.attach("b")
        session, launches = queue_slow_work(a, 11, 1000)  # 11 s of work
        waits = wait_many(a, session, launches[-1], 100)  # more waits than device threads
        time.sleep(0.3)
        calls: list[tuple[str, float]] = []
        n = 1 << 12
        x = np.arange(n, dtype=np.float32)
        bx = prompt(calls, "allocate", lambda: b.buffer(x.nbytes))
        by = prompt(calls, "allocate", lambda: b.buffer(x.nbytes))
        prompt(
            calls,
            "write",
            lambda: b.stub.WriteBuffer(
                chunks(bx, x.tobytes(), 1 << 20), metadata=b.metadata, timeout=20
            ),
        )
        prompt(
            calls,
            "write",
            lambda: b.stub.WriteBuffer(
                chunks(by, x.tobytes(), 1 << 20), metadata=b.metadata, timeout=20
            ),
        )
        saxpy = prompt(calls, "load", lambda: b.load(SAXPY))
        scalars = {"n": u32(n), "a": pb.Scalar(f32=2.0)}
        launch = pb.LaunchRequest(
            session_id=saxpy, operands=[bx, by], results=[by], runtime_scalars=scalars, wait=True
        )
        assert prompt(calls, "launch", lambda: b.Launch(launch)).completed
        read = pb.ReadBufferRequest(buffer_id=by)
        data = prompt(calls, "read", lambda: b"".join(c.data for c in b.ReadBuffer(read)))
        np.testing.assert_allclose(np.frombuffer(data, np.float32), 3 * x)
        slow = [(name, round(seconds, 3)) for name, seconds in calls if seconds > PROMPT]
        assert not slow, f"calls of tenant b held up by tenant a's waits: {slow}"
        assert not any(wait.done() for wait in waits), "A's work should still be running"
        a.detach()
        for wait in waits:
            wait.cancel()
        b.detach()


def test_a_detached_client_is_freed_without_waiting_behind_others_work(
    served: tuple[ServerThread, dict[str, str]],
) -> None:
    server, tokens = served
    with grpc.insecure_channel(server.address) as channel:
        busy, leaving, watcher = (Caller(channel, tokens[key]) for key in ("b", "a", "a"))
        busy.attach("busy")
        leaving.attach("leaving")
        watcher.attach("watcher")
        other_session, other_launches = queue_slow_work(busy, 10, 1000)
        others_waits = wait_many(busy, other_session, other_launches[-1], 40)
        queue_slow_work(leaving, 20, 1000)  # 20 s of its own work, then it goes
        time.sleep(0.2)
        leaving.detach()
        started = time.monotonic()
        while True:
            (team_a,) = watcher.status().tenants
            if (team_a.sessions, team_a.buffers, team_a.launches_in_flight) == (0, 0, 0):
                break
            assert time.monotonic() - started < 3.0, f"still held: {team_a}"
            time.sleep(0.05)
        assert team_a.memory_bytes == 0
        assert not any(wait.done() for wait in others_waits)
        busy.detach()
        watcher.detach()


def test_writes_waiting_on_a_tenants_kernels_hold_no_device_threads(
    served: tuple[ServerThread, dict[str, str]],
) -> None:
    """More writes than device-work threads, each behind 4 s of its buffer's earlier work:
    they wait without a thread, so the other tenant's loads and allocations go on, and so
    do the writing tenant's own."""
    server, tokens = served
    with grpc.insecure_channel(server.address) as channel:
        attackers = [Caller(channel, tokens["a"]) for _ in range(8)]
        results = []
        for index, attacker in enumerate(attackers):
            attacker.attach(f"a-{index}")
            session = attacker.load(SLOW)
            x, y = attacker.buffer(16), attacker.buffer(16)
            results.append(y)
            scalars = {"n": u32(4), "ms": u32(4000)}
            attacker.Launch(
                pb.LaunchRequest(
                    session_id=session, operands=[x], results=[y], runtime_scalars=scalars
                )
            )
        writes = [  # each y is its launch's result: each write waits for that kernel
            attacker.stub.WriteBuffer.future(
                chunks(y, bytes(16), 16), metadata=attacker.metadata, timeout=30
            )
            for attacker, y in zip(attackers, results, strict=True)
            for _ in range(2)
        ]
        time.sleep(0.3)
        victim = Caller(channel, tokens["b"])
        victim.attach("b")
        calls: list[tuple[str, float]] = []
        prompt(calls, "load", lambda: victim.load(SAXPY))
        buffer = prompt(calls, "allocate", lambda: victim.buffer(4096))
        prompt(
            calls,
            "write",
            lambda: victim.stub.WriteBuffer(
                chunks(buffer, bytes(4096), 4096), metadata=victim.metadata, timeout=20
            ),
        )
        prompt(calls, "own tenant's allocate", lambda: attackers[0].buffer(4096))
        slow = [(name, round(seconds, 3)) for name, seconds in calls if seconds > PROMPT]
        assert not slow, f"calls held up by tenant a's waiting writes: {slow}"
        assert not any(write.done() for write in writes), "A's writes should still wait"
        for write in writes:
            assert write.result(timeout=30).bytes_written == 16
        for attacker in attackers:
            attacker.detach()
        victim.detach()


def test_ring_copies_waiting_on_kernels_leave_the_copy_threads_to_others(
    served: tuple[ServerThread, dict[str, str]],
) -> None:
    """More ring copies than copy threads, each behind 4 s of its buffer's earlier work:
    another tenant's 1 MiB write through its own ring is not held up by them."""
    server, tokens = served
    attackers = [Client(server.address, token=tokens["a"]) for _ in range(6)]
    writers: list[threading.Thread] = []
    try:
        ready = []
        for attacker in attackers:  # everything made first: the waits then overlap
            session = attacker.load(SLOW, version=1)
            x, y = attacker.empty(4, np.float32), attacker.empty(4, np.float32)
            session.launch(operands=[x], results=[y], n=4, ms=0)  # the ring opened
            ready.append((session, x, y, attacker.shared_array(4, np.float32)))
        with Client(server.address, token=tokens["b"]) as victim:
            data = np.arange(1 << 18, dtype=np.float32)  # 1 MiB: through shared memory
            with victim.empty(data.size, np.float32) as target, victim.load(SAXPY) as saxpy:
                saxpy.launch(operands=[target, target], results=[target], n=data.size, a=1.0)
                target.write(np.zeros_like(data))  # the ring (opened by the launch), a segment
                for session, x, y, shared in ready:
                    session.launch(operands=[x], results=[y], n=4, ms=4000, wait=False)
                    writer = threading.Thread(target=y.write, args=(shared,), daemon=True)
                    writer.start()  # a COPY record behind the launch: it waits for the kernel
                    writers.append(writer)
                time.sleep(0.5)
                started = time.perf_counter()
                target.write(data)
                took = time.perf_counter() - started
                np.testing.assert_array_equal(target.read(), data)
        assert took < PROMPT, f"a 1 MiB ring write took {took:.3f} s behind tenant a's copies"
        assert any(writer.is_alive() for writer in writers), "A's copies should still wait"
    finally:
        for writer in writers:
            writer.join(30)
        for attacker in attackers:
            attacker.close()
