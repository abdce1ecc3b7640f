"""Stopping ``accyd serve``: the grace is kept, waiting calls hear why, a bad start exits once."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import grpc
import pytest

from accy.protocol.launch.v1 import launch_pb2 as pb
from accyd.process.exits import EXIT_NEVER_READY, EXIT_STOPPED_BUSY
from accyd.process.signals import capture_signals
from tests.launch_service.harness import attach, details

NEVER_ENDS = '''
[[kernel]]
target = "test.kernel.spin"
version = 1
format = "host_py"
entry = "spin"
code = """
import time

def spin(grid, block, buffers, scalars):
    while True:
        time.sleep(0.05)
"""
buffers = 1
scalars = [{ name = "n", dtype = "u32" }]
grid = [1]
block = [1]

[[pipeline]]
target = "test.spin"
version = 1
scalars = [{ name = "n", dtype = "u32", min = 1, max = 1024 }]
operands = []
results = [{ name = "y", dtype = "u8", extent = "n" }]

[[pipeline.stage]]
kernel = "test.kernel.spin"
version = 1
buffers = ["y"]
scalars = ["n"]
'''


def _serve(tmp_path: Path, *flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "accyd.cli", "serve", "--backend", "host", "--log-format",
         "json", *flags],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip


def _first_line(process: subprocess.Popen[str]) -> dict[str, object]:
    assert process.stderr is not None
    line: dict[str, object] = json.loads(process.stderr.readline())
    return line


def test_sigterm_keeps_the_grace_with_a_kernel_that_never_ends(tmp_path: Path) -> None:
    (tmp_path / "catalog").mkdir()
    (tmp_path / "catalog" / "spin.toml").write_text(NEVER_ENDS)
    address = f"unix:{tmp_path / 'accyd.sock'}"
    process = _serve(
        tmp_path, "--no-supervise", "--grace", "1", "--listen", address,
        "--catalog", str(tmp_path / "catalog"),
    )  # fmt: skip
    try:
        assert _first_line(process)["event"] == "accyd serving"
        with grpc.insecure_channel(address) as channel:
            client = attach(channel)
            session = client.LoadPipeline(pb.LoadPipelineRequest(target="test.spin")).session_id
            out = client.AllocateBuffer(pb.AllocateBufferRequest(byte_size=16)).buffer_id
            launch = pb.LaunchRequest(
                session_id=session, results=[out], runtime_scalars={"n": pb.Scalar(u32=16)}
            )
            client.Launch(launch)
            client.Launch(launch)  # queued behind the first: never started
            waiting: Future[object] = Future()

            def wait() -> None:
                try:
                    waiting.set_result(
                        client.WaitLaunch(pb.WaitLaunchRequest(session_id=session), timeout=30)
                    )
                except grpc.RpcError as error:
                    waiting.set_result(error)

            threading.Thread(target=wait, daemon=True).start()
            time.sleep(0.3)
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            answer = waiting.result(timeout=20)
            assert isinstance(answer, grpc.RpcError)
            assert answer.code() == grpc.StatusCode.UNAVAILABLE, answer.details()
            assert "shutting down" in (answer.details() or "")
            assert details(answer)["ErrorInfo"].reason == "SHUTTING_DOWN"
            assert process.wait(timeout=10) == EXIT_STOPPED_BUSY
            assert time.monotonic() - started < 1 + 2
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_manifest_typo_exits_once_without_restarts_or_traceback(tmp_path: Path) -> None:
    (tmp_path / "catalog").mkdir()
    (tmp_path / "catalog" / "bad.toml").write_text("[[pipeline]]\ntarget = 1\n")
    started = time.monotonic()
    process = _serve(
        tmp_path, "--listen", f"unix:{tmp_path / 'accyd.sock'}",
        "--catalog", str(tmp_path / "catalog"),
    )  # fmt: skip
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == EXIT_NEVER_READY
    assert time.monotonic() - started < 15
    assert stderr.count("cannot serve") == 1, stderr
    assert "bad.toml" in stderr
    assert "Traceback" not in stderr and "restarting" not in stderr


def test_a_busy_tcp_port_exits_once_with_one_clear_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = _serve(tmp_path, "--insecure", "--listen", f"127.0.0.1:{port}")
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == EXIT_NEVER_READY
    assert stderr.count("cannot serve") == 1, stderr
    assert f"127.0.0.1:{port}" in stderr
    assert "Traceback" not in stderr and "restarting" not in stderr


def test_signals_drain_first_force_second_and_restore_the_old_handlers() -> None:
    calls: list[str] = []
    signals = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)
    before = [signal.getsignal(signum) for signum in signals]
    with capture_signals(
        drain=lambda s: calls.append(f"drain {s.name}"),
        force=lambda s: calls.append(f"force {s.name}"),
        reload=lambda s: calls.append("reload"),
    ):
        for signum in signals:
            os.kill(os.getpid(), signum)
            time.sleep(0.05)
    assert calls == ["reload", "drain SIGTERM", "force SIGINT"]
    # each as it was (SIGINT is default_int_handler, or SIG_IGN under a shell's `cmd &`)
    assert [signal.getsignal(signum) for signum in signals] == before


@pytest.mark.parametrize("code", [EXIT_NEVER_READY, EXIT_STOPPED_BUSY])
def test_the_supervisor_does_not_restart_a_server_that_never_served_or_was_stopped(
    tmp_path: Path, code: int
) -> None:
    from accyd.process.supervisor import RestartPolicy, Supervisor

    starts = tmp_path / "starts"
    script = f"open({str(starts)!r}, 'a').write('x'); raise SystemExit({code})"
    supervisor = Supervisor([sys.executable, "-c", script], RestartPolicy(backoff_initial=0.01))
    assert supervisor.run() == code
    assert starts.read_text() == "x"
