"""Client death, graceful shutdown and the ``accyd serve`` process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from accy.protocol.launch.v1 import launch_pb2 as pb
from accyd.process.steps import within
from tests.launch_service.harness import ServerThread, attach, chunks, make_config

SCAN = "accy.kernel.device_scan"


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[ServerThread]:
    running = ServerThread(make_config(tmp_path, "unix"))
    yield running
    if not running.server._stopped:
        running.stop()


def eventually(check: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def busy_client(channel: grpc.Channel, n: int) -> tuple[object, str, str]:
    client = attach(channel)
    session = client.LoadPipeline(pb.LoadPipelineRequest(target=SCAN)).session_id
    ids = [
        client.AllocateBuffer(
            pb.AllocateBufferRequest(byte_size=4 * n, dtype=pb.DTYPE_F32)
        ).buffer_id
        for _ in range(2)
    ]
    client.WriteBuffer(chunks(ids[0], np.ones(n, np.float32).tobytes(), 1 << 20))
    scalars = {"n": pb.Scalar(u32=n)}
    client.AllocateIntermediates(
        pb.AllocateIntermediatesRequest(session_id=session, runtime_scalars=scalars)
    )
    for _ in range(3):
        client.Launch(
            pb.LaunchRequest(
                session_id=session, operands=ids[:1], results=ids[1:], runtime_scalars=scalars
            )
        )
    return client, session, ids[1]


def test_a_client_whose_attach_stream_ends_loses_everything(fresh: ServerThread) -> None:
    baseline = fresh.backend.memory_in_use()
    with grpc.insecure_channel(fresh.address) as channel:
        client, _, _ = busy_client(channel, 1 << 20)
        assert fresh.backend.memory_in_use() > baseline
        client.detach()  # type: ignore[attr-defined]
        assert eventually(lambda: fresh.backend.memory_in_use() == baseline)

        def counts() -> tuple[int, int, int]:
            status = fresh.server.daemon.status()
            return status.clients, status.sessions, status.buffers

        # The detach frees the memory first, then forgets the records under the core's lock.
        assert eventually(lambda: counts() == (0, 0, 0)), counts()


def test_a_closed_channel_detaches_the_client(fresh: ServerThread) -> None:
    channel = grpc.insecure_channel(fresh.address)
    busy_client(channel, 4096)
    channel.close()
    assert eventually(lambda: fresh.server.daemon.status().clients == 0)
    assert eventually(lambda: fresh.backend.memory_in_use() == 0)


def test_graceful_shutdown_drains_calls_in_flight_then_releases(fresh: ServerThread) -> None:
    socket_path = Path(fresh.address.removeprefix("unix:"))
    with grpc.insecure_channel(fresh.address) as channel:
        client, session, result = busy_client(channel, 1 << 23)
        waiting = client.stub.Launch.future(  # type: ignore[attr-defined]
            pb.LaunchRequest(
                session_id=session,
                operands=[result],
                results=[result],
                runtime_scalars={"n": pb.Scalar(u32=1 << 23)},
                wait=True,
            ),
            metadata=client.metadata,  # type: ignore[attr-defined]
        )
        time.sleep(0.05)
        fresh.stop()
        assert waiting.result(timeout=10).completed
        with pytest.raises(StopIteration):
            while True:
                next(client.stream)  # type: ignore[attr-defined]
    assert fresh.backend.memory_in_use() == 0
    assert not socket_path.exists()
    with grpc.insecure_channel(fresh.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            health.Check(health_pb2.HealthCheckRequest(), timeout=1)
        assert caught.value.code() in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
        )


def test_accyd_serve_polls_its_loop_as_told(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "accyd.cli", "serve", "--no-supervise", "--backend", "host",
         "--log-format", "json", "--loop-spin-us", "300",
         "--listen", f"unix:{tmp_path / 'accyd.sock'}"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert process.stderr is not None
        first = json.loads(process.stderr.readline())
        assert (first["event"], first["loop_spin_us"]) == ("accyd serving", 300)
        with grpc.insecure_channel(f"unix:{tmp_path / 'accyd.sock'}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == 1
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_accyd_serve_logs_its_backend_first_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    socket_path = tmp_path / "s" / "accyd.sock"
    process = subprocess.Popen(
        [sys.executable, "-m", "accyd.cli", "serve", "--no-supervise", "--backend", "auto",
         "--log-format", "json",
         "--listen", f"unix:{socket_path}"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        env={**os.environ, "ACCYD_GRACE_SECONDS": "2"},
    )  # fmt: skip
    try:
        assert process.stderr is not None
        first = json.loads(process.stderr.readline())
        assert first["event"] == "accyd serving"
        assert first["backend"] in ("host", "cuda") and first["requested_backend"] == "auto"
        # Polling goes by backend: on CUDA by default, never on the host's kernel threads.
        assert first["loop_spin_us"] == (500 if first["backend"] == "cuda" else 0)
        assert first["listen"] == [f"unix:{socket_path}"]
        assert oct(socket_path.stat().st_mode & 0o777) == oct(0o660)
        assert oct(socket_path.parent.stat().st_mode & 0o777) == oct(0o700)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
        assert not socket_path.exists()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_tcp_without_credentials_needs_insecure(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="--insecure"):
        ServerThread(make_config(tmp_path, "tcp", insecure=False))


def test_a_stop_step_that_hangs_is_left_behind_after_its_time() -> None:
    async def stop_with_a_hanging_step() -> tuple[float, bool]:
        never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        started = time.monotonic()
        await within(never, 0.05, "a step that never ends")
        return time.monotonic() - started, never.cancelled()

    took, cancelled = asyncio.run(stop_with_a_hanging_step())
    assert 0.04 <= took < 1.0
    assert not cancelled  # left running, not cancelled: the process is about to exit anyway
