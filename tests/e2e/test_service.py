"""The client library and CLI through a real daemon (host backend), on Unix socket and TCP."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from accy import Client, errors, references
from accy._control import Allocated
from accy._resources import new_buffer
from accy.protocol.launch.v1 import launch_pb2 as pb
from accy.protocol.ring import RING_ENV
from accy.testing import RunningDaemon, call, transport_of
from tests.e2e.workers import scan_round_trip

SCAN, SUM, SAXPY = "accy.kernel.device_scan", "accy.kernel.reduce_sum", "accy.kernel.saxpy"


def _check(
    target: str, operands: list[np.ndarray], results: list[np.ndarray], **scalars: float
) -> None:
    reference = references.find(target)
    assert reference is not None
    for comparison in references.compare(reference, operands, results, scalars):
        assert comparison.ok, comparison


def test_pipelines_describe_the_builtins(target: str) -> None:
    with Client(target) as client:
        infos = {p.target: p for p in client.pipelines()}
    assert {SCAN, SUM, SAXPY} <= set(infos)
    saxpy = infos[SAXPY]
    assert [b.name for b in saxpy.operands] == ["x", "y"]
    assert [(s.name, s.dtype.name) for s in saxpy.runtime_scalars] == [
        ("n", "uint32"),
        ("a", "float32"),
    ]
    assert infos[SCAN].scalar("n").max == 2**30 and infos[SCAN].stage_count == 1
    assert infos[SUM].results[0].extent == "1"


def test_status_counts_this_client(target: str) -> None:
    with Client(target) as client:
        assert client.attachment.backend == "host"
        before = client.status()
        with client.empty(1000, "f32"):
            now = client.status()
            assert now.my_buffers == before.my_buffers + 1
            assert now.my_memory_in_use >= 4000
        assert now.serving and now.clients >= 1


def test_every_call_against_numpy(target: str) -> None:
    rng = np.random.default_rng(5)
    n = (2 << 20) + 5  # 8 MiB of f32: twice the default message limit, and not a tile multiple
    x = rng.random(n, dtype=np.float32)
    with (
        Client(target, client_name="e2e") as client,
        client.buffer(x) as xb,
        client.empty(n, np.float32) as yb,
    ):
        np.testing.assert_array_equal(xb.read(), x)
        np.testing.assert_array_equal(xb.read(count=7, offset=400), x[100:107])
        with client.load(SCAN) as session:
            assert session.created and session.info.target == SCAN
            again = client.load(SCAN)
            assert again.id == session.id and not again.created
            assert session.allocate_intermediates(n=n) > 0
            launch = session.launch(operands=[xb], results=[yb], n=n)
            assert launch.completed
            _check(SCAN, [x], [yb.read()], n=n)
            yb.write(np.zeros(n, np.float32))
            later = session.launch([xb], [yb], wait=False, n=n)
            later.wait()
            assert later.completed
            _check(SCAN, [x], [yb.read()], n=n)
            session.launch([xb], [yb], wait=False, n=n // 2)
            session.wait()
            _check(SCAN, [x[: n // 2]], [yb.read(count=n // 2)], n=n // 2)
        with client.load(SUM) as total, client.empty(1, "f32") as out:
            total.launch([xb], [out], n=n)
            _check(SUM, [x], [out.read()], n=n)


def test_run_one_call_each_builtin(target: str) -> None:
    rng = np.random.default_rng(6)
    x, y = rng.random(5000, dtype=np.float32), rng.random(5000, dtype=np.float32)
    with Client(target) as client:
        (scan,) = client.run(SCAN, x)
        _check(SCAN, [x], [scan], n=5000)
        (total,) = client.run(SUM, x, n=5000)
        _check(SUM, [x], [total], n=5000)
        (out,) = client.run(SAXPY, x, y, a=-1.5)
        _check(SAXPY, [x, y], [out], n=5000, a=-1.5)
        assert client.status().my_buffers == 0  # the one-call path leaves no buffers


def test_one_session_applies_launches_in_order(daemon: RunningDaemon) -> None:
    """acc = a_k * acc + 1, in place (out is operand x): any reordering changes the result."""
    n, steps = 4096, 40
    factors = np.random.default_rng(7).uniform(-1.5, 1.5, steps).astype(np.float32)
    expected = np.zeros(n, np.float32)
    with Client(daemon.unix_target) as client, client.load(SAXPY) as session:
        acc = client.buffer(expected)
        ones = client.buffer(np.ones(n, np.float32))
        for a in factors:
            session.launch(operands=[acc, ones], results=[acc], wait=False, n=n, a=float(a))
            expected = a * expected + np.float32(1)
        session.wait()
        got = acc.read()
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    shuffled = np.zeros(n, np.float32)
    for a in factors[::-1]:
        shuffled = a * shuffled + np.float32(1)
    assert not np.allclose(shuffled, expected, rtol=1e-3)  # the test can tell orders apart


def test_a_read_right_after_launches_not_waited_for_sees_them_all(target: str) -> None:
    """No wait between the launches and the read: the read (a small one, over ReadBuffer) is
    ordered after every launch the client made, on each way in."""
    n, count = 64, 300
    with Client(target) as client, client.load(SAXPY) as session:
        x, y = client.buffer(np.ones(n, np.float32)), client.buffer(np.zeros(n, np.float32))
        for _ in range(count):  # y = 0.5 * x + y, in place: each launch needs the last
            session.launch([x, y], [y], wait=False, n=n, a=0.5)
        np.testing.assert_array_equal(y.read(), np.full(n, count * 0.5, np.float32))
        y.write(np.zeros(n, np.float32))  # a write is ordered after them too
        session.launch([x, y], [y], wait=False, n=n, a=0.5)
        np.testing.assert_array_equal(y.read(), np.full(n, 0.5, np.float32))


def test_threads_of_one_client_share_its_launch_stream(target: str) -> None:
    """8 threads launch over the client's one ring (or ring stream, or unary calls), each its
    own chain; each chain is right."""
    n, steps = 2048, 25
    rng = np.random.default_rng(11)
    factors = rng.uniform(-1.2, 1.2, (8, steps)).astype(np.float32)

    with Client(target) as client, client.load(SAXPY) as session:

        def chain(row: np.ndarray) -> np.ndarray:
            acc, ones = (
                client.buffer(np.zeros(n, np.float32)),
                client.buffer(np.ones(n, np.float32)),
            )
            for step, a in enumerate(row):  # waited and not, mixed: a thread's order is kept
                session.launch([acc, ones], [acc], wait=step % 4 == 3, n=n, a=float(a))
            session.wait()
            return acc.read()

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(chain, factors))
        path = transport_of(client).path  # one way carried every launch of every thread
        if not target.startswith("unix:"):
            assert path == "ring-stream"
        else:
            assert path == ("unary" if os.environ.get(RING_ENV) == "0" else "ring")
    for row, got in zip(factors, results, strict=True):
        expected = np.zeros(n, np.float32)
        for a in row:
            expected = a * expected + np.float32(1)
        np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_two_loads_of_one_pipeline_are_released_one_by_one(daemon: RunningDaemon) -> None:
    with Client(daemon.unix_target) as client:
        first, second = client.load(SAXPY), client.load(SAXPY)
        assert first.id == second.id and first.created and not second.created
        x = client.buffer(np.ones(64, np.float32))
        first.close()  # the other part of the program still holds its load
        second.launch([x, x], [x], n=64, a=1.0)
        np.testing.assert_array_equal(x.read(), np.full(64, 2, np.float32))
        assert client.status().my_sessions == 1
        second.close()
        assert client.status().my_sessions == 0
        with pytest.raises(errors.NotFound):
            call(client, "Release", pb.ReleaseRequest(session_id=first.id))


def test_clients_cannot_see_each_other(daemon: RunningDaemon) -> None:
    with Client(daemon.unix_target) as alice, Client(daemon.unix_target) as bob:
        session = alice.load(SCAN)
        secret = alice.buffer(np.arange(16, dtype=np.float32))
        mine = bob.empty(16, "f32")
        # Bob holds Alice's ids through objects bound to his own client.
        link = bob._conn.last
        assert link is not None
        forged = Allocated(secret.id, secret.capacity, 0)
        stolen = new_buffer(bob._control, link, forged, secret.nbytes, secret.dtype)
        with pytest.raises(errors.NotFound):
            stolen.read()
        with pytest.raises(errors.NotFound):
            stolen.write(np.zeros(16, np.float32))
        with pytest.raises(errors.NotFound):
            stolen.free()
        bob_session = bob.load(SCAN)
        with pytest.raises(errors.NotFound):
            bob_session.launch([secret.id], [mine], n=16)
        # Alice's session id on Bob's calls: answered exactly as an unknown id.
        for method, request in [
            (
                "Launch",
                pb.LaunchRequest(session_id=session.id, operands=[mine.id], results=[mine.id]),
            ),
            ("AllocateIntermediates", pb.AllocateIntermediatesRequest(session_id=session.id)),
            ("WaitLaunch", pb.WaitLaunchRequest(session_id=session.id)),
            ("Release", pb.ReleaseRequest(session_id=session.id)),
        ]:
            with pytest.raises(errors.NotFound):
                call(bob, method, request)
        assert bob.status().my_buffers == 1 and bob.status().my_sessions == 1
        np.testing.assert_array_equal(secret.read(), np.arange(16, dtype=np.float32))


def test_errors_arrive_typed_with_details(daemon: RunningDaemon) -> None:
    with Client(daemon.unix_target) as client:
        with pytest.raises(errors.NotFound) as unknown:
            client.load("no.such.pipeline")
        assert unknown.value.domain == "accy.dev" and unknown.value.reason
        session = client.load(SCAN)
        small, big = client.empty(10, "f32"), client.empty(100, "f32")
        with pytest.raises(errors.InvalidArgument) as too_small:
            session.launch([small], [big], n=100)
        assert too_small.value.field_violations
        with pytest.raises(errors.InvalidArgument) as bound:
            session.launch([big], [big], n=2**31)
        assert bound.value.field_violations
        session.allocate_intermediates(n=100)
        huge_x, huge_y = client.empty(10_000, "f32"), client.empty(10_000, "f32")
        with pytest.raises(errors.FailedPrecondition) as scratch:
            session.launch([huge_x], [huge_y], n=10_000)
        assert (
            "allocate" in scratch.value.message.lower()
            or "intermediates" in scratch.value.message.lower()
        )


def test_detached_client_loses_its_buffers(daemon: RunningDaemon) -> None:
    with Client(daemon.unix_target) as watcher:
        before = watcher.status().buffers
        leaver = Client(daemon.unix_target)
        kept = (leaver.empty(1 << 20, "u8"), leaver.load(SCAN))  # held: not freed when dropped
        assert watcher.status().buffers == before + 1 and not kept[0].closed
        leaver.close()
        deadline = time.monotonic() + 10
        while watcher.status().buffers != before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watcher.status().buffers == before


def test_sixteen_client_processes_at_once(daemon: RunningDaemon) -> None:
    context = multiprocessing.get_context("spawn")
    targets = [daemon.unix_target if i % 2 else daemon.tcp_target for i in range(16)]
    with context.Pool(16) as pool:
        pending = pool.starmap_async(scan_round_trip, [(t, seed) for seed, t in enumerate(targets)])
        outcomes = pending.get(timeout=120)
    failures = [f"worker {seed}: {error}" for seed, error in outcomes if error]
    assert not failures, "\n".join(failures)


def _accy(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-c",
        "import sys; from accy.cli import main; sys.exit(main())",
        *args,
    ]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=120, env=env, check=False
    )


def test_cli_run_scan_check_million(daemon: RunningDaemon) -> None:
    done = _accy("--target", daemon.unix_target, "run", SCAN, "--n", "1000000", "--check")
    assert done.returncode == 0, done.stderr + done.stdout
    assert "check y" in done.stdout and "ok" in done.stdout


def test_cli_uses_accy_target_and_reports_json(daemon: RunningDaemon) -> None:
    env = dict(os.environ, ACCY_TARGET=daemon.unix_target)
    done = _accy(
        "run",
        SAXPY,
        "--n",
        "1000",
        "--scalar",
        "a=0.5",
        "--check",
        "--repeat",
        "3",
        "--json",
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert '"ok": true' in done.stdout
    assert _accy("pipelines", env=env).returncode == 0
    assert _accy("health", env=env).stdout.strip() == "SERVING"


def test_cli_without_daemon_says_where_it_looked(tmp_path: object) -> None:
    env = dict(os.environ, ACCY_TARGET="unix:/nonexistent/accyd.sock")
    done = _accy("status", env=env)
    assert done.returncode == 3
    assert "unix:/nonexistent/accyd.sock" in done.stderr and "accyd serve" in done.stderr
    assert done.stderr.count("\n") == 1


def test_cli_status_shows_every_field_the_daemon_sends(daemon: RunningDaemon) -> None:
    env = dict(os.environ, ACCY_TARGET=daemon.unix_target)
    done = _accy("status", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert set(pb.GetStatusResponse.DESCRIPTOR.fields_by_name) <= set(json.loads(done.stdout))
    text = _accy("status", env=env)
    assert text.returncode == 0, text.stderr
    for name in pb.GetStatusResponse.DESCRIPTOR.fields_by_name:
        assert name in text.stdout, name
