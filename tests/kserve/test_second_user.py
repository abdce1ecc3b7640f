"""Shared memory a caller of another user asks for: judged by that user, never the daemon's.

The daemon runs as root (CI's user) and lets a second user in through its Unix
socket's group, as the compose setup does; a program runs as ``nobody``. gRPC
names no Unix-socket caller, so there its registrations are refused, its own
objects too, with what to do instead; on TCP from the loopback the kernel names
its user: its own object is accepted and root's 0600 object refused (once read and
overwritten through the daemon).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from accy.testing import RunningDaemon, running_daemon
from accyd.doors.kserve.protocol import open_inference_pb2 as pb
from tests.kserve.harness import SHM

NOBODY = 65534

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="runs a program as another user: only root can"
)

PROGRAM = r"""
import json, os, sys
import grpc  # alone: copied where the second user may read it

unix, tcp, mine, requests = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
fd = os.open(f"/dev/shm/{mine}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
os.ftruncate(fd, 64)
os.close(fd)
out = {}
for where, target in (("unix", unix), ("tcp", tcp)):
    with grpc.insecure_channel(target) as channel:
        register = channel.unary_unary(
            "/inference.GRPCInferenceService/SystemSharedMemoryRegister"
        )  # bytes in, bytes out
        for whose, request in requests.items():
            try:
                register(bytes.fromhex(request), timeout=30)
                out[f"{where}/{whose}"] = "OK"
            except grpc.RpcError as error:
                out[f"{where}/{whose}"] = f"{error.code().name}: {error.details()}"
print(json.dumps(out))
"""


def _python_for_nobody() -> str | None:
    """A Python of this one's version that another user may run (this one may sit in root's
    home): the system's, given a readable copy of this environment's grpc."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for folder in ("/usr/bin", "/usr/local/bin"):
        candidate = Path(folder, f"python{version}")
        if candidate.exists() and candidate.stat().st_mode & 0o001:
            return str(candidate)
    return None


@pytest.fixture
def readable_grpc() -> Iterator[Path]:
    """This environment's grpc, copied where any user may read it (the checkout may not be)."""
    folder = Path(tempfile.mkdtemp(prefix="accy-grpc-"))
    try:
        site = Path(sysconfig.get_paths()["purelib"])
        shutil.copytree(site / "grpc", folder / "grpc")
        shutil.copy(site / "typing_extensions.py", folder)
        for path in [folder, *folder.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _as_nobody(python: str, site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, "-c", *args],
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def shared() -> Iterator[RunningDaemon]:
    """Root's daemon, its Unix socket let open to ``nobody``'s group."""
    with running_daemon(backend="host", extra=["--no-supervise"]) as running:
        socket = Path(running.unix_target.removeprefix("unix:"))
        for path, mode in ((socket.parent, 0o750), (socket, 0o660)):
            os.chown(path, 0, NOBODY)
            os.chmod(path, mode)
        yield running


def test_another_users_caller_registers_only_its_own_objects_and_only_where_named(
    shared: RunningDaemon, readable_grpc: Path
) -> None:
    python = _python_for_nobody()
    if python is None:
        pytest.skip(f"no Python {sys.version_info[:2]} that user {NOBODY} may run")
    tag = f"kserve_2u_{os.getpid()}"
    mine, roots = f"{tag}_mine", f"{tag}_root"
    secret = b"root's alone".ljust(64, b"\0")
    (SHM / roots).write_bytes(secret)
    os.chmod(SHM / roots, 0o600)
    try:
        assert shared.tcp_target is not None
        requests = {
            whose: pb.SystemSharedMemoryRegisterRequest(name=whose, key=f"/{key}", byte_size=64)
            .SerializeToString()
            .hex()
            for whose, key in (("mine", mine), ("roots", roots))
        }
        done = _as_nobody(
            python,
            readable_grpc,
            PROGRAM,
            shared.unix_target,
            shared.tcp_target,
            mine,
            json.dumps(requests),
        )
        assert done.returncode == 0, done.stderr
        results = json.loads(done.stdout)
    finally:
        (SHM / roots).unlink(missing_ok=True)
        (SHM / mine).unlink(missing_ok=True)
    assert results["tcp/mine"] == "OK"
    assert results["tcp/roots"].startswith("PERMISSION_DENIED"), results
    for whose in ("mine", "roots"):
        refusal = results[f"unix/{whose}"]
        assert refusal.startswith("PERMISSION_DENIED"), results
        assert "other users may connect" in refusal and "TCP" in refusal, refusal
