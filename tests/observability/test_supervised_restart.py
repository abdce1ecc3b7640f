"""``accyd serve`` under its supervisor: a device fault, NOT_SERVING, a restart, serving again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from accy.protocol.launch.v1 import launch_pb2 as pb
from accyd.tokens import hash_token, new_token
from tests.launch_service.harness import chunks, details
from tests.security.harness import Caller

FAULTY = Path(__file__).parents[1] / "catalogs" / "faulty"
SCAN = "accy.kernel.device_scan"
SERVING = health_pb2.HealthCheckResponse.SERVING


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def health(target: str) -> int | None:
    """The health status, or ``None`` where nothing answers."""
    with grpc.insecure_channel(target) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=0.5
            )
        except grpc.RpcError:
            return None
    return int(reply.status)


def until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.01)
    return found


class Supervised:
    """``accyd serve`` (supervised, host backend, faulty test catalog), logging JSON to a file."""

    def __init__(self, folder: Path) -> None:
        self.target = f"unix:{folder / 'accyd.sock'}"
        self.token = new_token()
        tokens = folder / "tokens.toml"
        tokens.write_text(f'[[token]]\ntenant = "team-a"\nsha256 = "{hash_token(self.token)}"\n')
        self.metrics_port = free_port()
        self.log = folder / "accyd.log"
        command = [
            sys.executable, "-m", "accyd.cli", "serve", "--backend", "host",
            "--catalog", str(FAULTY), "--listen", self.target, "--tokens", str(tokens),
            "--log-format", "json", "--log-level", "debug",
            "--metrics-port", str(self.metrics_port),
        ]  # fmt: skip
        with self.log.open("wb") as sink:
            self.process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)

    def events(self) -> list[dict[str, Any]]:
        lines = self.log.read_text(errors="replace").splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[Supervised]:
    daemon = Supervised(tmp_path)
    try:
        until(lambda: health(daemon.target) == SERVING, 60, "SERVING")
        yield daemon
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()
            daemon.process.wait()


def scan(caller: Caller, n: int) -> np.ndarray[Any, np.dtype[np.float32]]:
    session = caller.load(SCAN)
    x, y = caller.buffer(4 * n), caller.buffer(4 * n)
    caller.WriteBuffer(chunks(x, np.ones(n, np.float32).tobytes(), 1 << 16))
    scalars = {"n": pb.Scalar(u32=n)}
    caller.Launch(
        pb.LaunchRequest(
            session_id=session, operands=[x], results=[y], runtime_scalars=scalars, wait=True
        )
    )
    data = b"".join(c.data for c in caller.ReadBuffer(pb.ReadBufferRequest(buffer_id=y)))
    return np.frombuffer(data, np.float32)


def test_a_device_fault_restarts_the_server_which_serves_again(supervised: Supervised) -> None:
    with grpc.insecure_channel(supervised.target) as channel:
        victim = Caller(channel, supervised.token)
        before = victim.attach()
        session = victim.load("accy.test.fault")
        x, y = victim.buffer(16), victim.buffer(16)
        launch = pb.LaunchRequest(
            session_id=session, operands=[x], results=[y],
            runtime_scalars={"n": pb.Scalar(u32=4)}, wait=True,
        )  # fmt: skip
        with pytest.raises(grpc.RpcError) as caught:
            victim.Launch(launch)
        faulted = time.monotonic()
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert details(caught.value)["ErrorInfo"].reason == "DEVICE_LOST"
        victim.detach()

    def new_instance() -> bool:
        if health(supervised.target) != SERVING:
            return False
        with grpc.insecure_channel(supervised.target) as fresh:
            try:
                status = Caller(fresh, supervised.token).status()
            except grpc.RpcError:
                return False
        return status.instance_id != before.instance_id

    until(new_instance, 30, "restarted server")
    restart_seconds = time.monotonic() - faulted
    print(f"device fault to SERVING again: {restart_seconds:.3f} s")

    with grpc.insecure_channel(supervised.target) as channel:
        survivor = Caller(channel, supervised.token)
        survivor.attach()
        assert scan(survivor, 1000)[-1] == 1000
        status = survivor.status()
        survivor.detach()
    assert (status.restarts, status.device_faults, status.serving) == (1, 1, True)
    text = supervised.metrics()
    assert "accy_restarts 1.0" in text and "accy_device_faults_total 1.0" in text

    assert supervised.stop() == 0
    events = supervised.events()
    names = [event["event"] for event in events]
    assert names.count("accyd serving") == 2 and "supervisor.restarting" in names
    assert any(e["event"] == "device lost; exiting so the daemon restarts" for e in events)
    loaded = [e for e in events if e["event"] == "session loaded" and e["target"] == SCAN]
    assert loaded and {"client_id", "request_id", "session_id"} <= set(loaded[0])
    assert loaded[0]["tenant"] == "team-a"
    assert not Path(supervised.target.removeprefix("unix:")).exists()


def test_sigterm_reaches_the_child_and_the_supervisor_exits_with_its_code(
    supervised: Supervised,
) -> None:
    children = [e["pid"] for e in supervised.events() if e["event"] == "accyd serving"]
    assert children and children[0] != supervised.process.pid
    os.kill(supervised.process.pid, signal.SIGTERM)
    assert supervised.process.wait(timeout=30) == 0
    with pytest.raises(ProcessLookupError):
        os.kill(children[0], 0)
    assert "accyd stopped" in [e["event"] for e in supervised.events()]


def test_a_server_whose_supervisor_is_gone_stops(tmp_path: Path) -> None:
    socket_path = tmp_path / "accyd.sock"
    serve = (
        f"{sys.executable} -m accyd.cli serve --no-supervise --backend host "
        f"--listen unix:{socket_path} --log-format json > {tmp_path / 'log'} 2>&1"
    )
    # The shell plays the supervisor: it starts the server and exits once it serves.
    script = f"ACCYD_SUPERVISOR_PID=$$ {serve} & while [ ! -S {socket_path} ]; do sleep 0.05; done"
    subprocess.run(["sh", "-c", script], timeout=60, check=True)
    log = tmp_path / "log"
    until(lambda: "accyd stopped" in log.read_text(), 15, "stop after the supervisor exited")
    events = [json.loads(line)["event"] for line in log.read_text().splitlines()]
    assert "stop requested" in events and not socket_path.exists()
