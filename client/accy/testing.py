"""Run a real ``accyd serve`` in a subprocess for tests and benchmarks, and stop it after.

The daemon is started as a program, the way users start it; nothing of the
daemon's package is imported here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2

__all__ = ["RunningDaemon", "free_port", "running_daemon", "serving"]

_MAIN = "import sys; from accyd.cli import main; sys.exit(main())"


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class RunningDaemon:
    """A daemon process and the addresses it serves."""

    process: subprocess.Popen[bytes]
    unix_target: str
    tcp_target: str | None
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def serving(target: str, timeout: float = 1.0) -> bool:
    """Whether the gRPC health service at ``target`` answers SERVING."""
    with grpc.insecure_channel(target) as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            health_pb2.HealthCheckRequest.SerializeToString,
            health_pb2.HealthCheckResponse.FromString,
        )
        try:
            reply = check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


@contextlib.contextmanager
def running_daemon(
    *,
    backend: str = "host",
    tcp: bool = True,
    ready_timeout: float = 60.0,
    extra: tuple[str, ...] = (),
) -> Iterator[RunningDaemon]:
    """``accyd serve`` on a fresh Unix socket (and TCP loopback), ready to serve; stopped after."""
    folder = Path(tempfile.mkdtemp(prefix="accy-e2e-"))
    unix_target = f"unix:{folder}/s.sock"
    tcp_target = f"127.0.0.1:{free_port()}" if tcp else None
    command = [sys.executable, "-c", _MAIN, "serve", "--backend", backend, "--listen", unix_target]
    if tcp_target:
        command += ["--listen", tcp_target]
    command += list(extra)
    env = dict(os.environ, ACCYD_INSECURE="true", ACCYD_CACHE_DIR=str(folder / "cache"))
    log = folder / "accyd.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
    daemon = RunningDaemon(process, unix_target, tcp_target, log)
    try:
        deadline = time.monotonic() + ready_timeout
        while not serving(unix_target):
            if process.poll() is not None:
                raise RuntimeError(f"accyd exited with {process.returncode}:\n{daemon.log_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"accyd did not serve within {ready_timeout} s:\n{daemon.log_text()}"
                )
            time.sleep(0.05)
        yield daemon
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(folder, ignore_errors=True)
