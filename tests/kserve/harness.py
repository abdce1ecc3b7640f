"""Helpers of the KServe door's tests: the outside tools, a raw stub, requests, counts."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from accy.protocol.launch.v1 import launch_pb2, launch_pb2_grpc
from accy.testing import RunningDaemon
from accyd.doors.kserve.protocol import open_inference_pb2 as pb
from accyd.doors.kserve.protocol import open_inference_pb2_grpc
from tests.security.harness import TokenSpec

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = Path(__file__).with_name("programs")
TENANTS = {"alpha": TokenSpec("alpha"), "beta": TokenSpec("beta")}
SHM = Path("/dev/shm")


@dataclass(frozen=True)
class Tools:
    python: Path
    """The Python of tritonclient's own environment."""
    perf_analyzer: Path


def find_tools() -> Tools | str:
    """The tools ``scripts/kserve_tools.sh`` installs, or why they are not there."""
    folder = Path(os.environ.get("ACCY_KSERVE_TOOLS", ROOT / ".kserve-tools"))
    tools = Tools(folder / "venv" / "bin" / "python", folder / "bin" / "perf_analyzer")
    if not (folder / "stamp").is_file() or not all(p.exists() for p in vars(tools).values()):
        return (
            f"tritonclient and perf_analyzer are not installed in {folder}: "
            "run scripts/kserve_tools.sh"
        )
    return tools


def daemon_of(daemons: dict[str, RunningDaemon], kind: str) -> RunningDaemon:
    return daemons[kind]


def url_of(daemon: RunningDaemon, transport: str) -> str:
    if transport == "unix":
        return daemon.unix_target
    assert daemon.tcp_target is not None
    return daemon.tcp_target


def run_program(
    tools: Tools,
    name: str,
    url: str,
    token: str | None,
    *args: str,
    timeout: float = 90,
    folder: Path = PROGRAMS,
) -> subprocess.CompletedProcess[str]:
    """Run one of ``folder``'s programs with tritonclient's Python; it must exit 0."""
    command = [str(tools.python), str(folder / f"{name}.py"), "-u", url, *args]
    if token is not None:
        command += ["--token", token]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as error:
        raise AssertionError(
            f"{name} did not finish within {timeout} s:\n{error.stdout!r}\n{error.stderr!r}"
        ) from None
    assert done.returncode == 0, f"{name} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


class Door:
    """A raw stub of ``inference.GRPCInferenceService`` with a caller's token."""

    def __init__(self, target: str, token: str | None = None) -> None:
        self.channel = grpc.insecure_channel(target)
        self.stub = open_inference_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.metadata = () if token is None else (("authorization", f"Bearer {token}"),)

    def __call__(self, method: str, request: Any, timeout: float = 30) -> Any:
        return getattr(self.stub, method)(request, metadata=self.metadata, timeout=timeout)

    def refusal(self, method: str, request: Any) -> grpc.RpcError:
        """The error ``method`` fails with (it must fail)."""
        try:
            self(method, request)
        except grpc.RpcError as error:
            return error
        raise AssertionError(f"{method} succeeded")

    def register(self, name: str, key: str, byte_size: int, offset: int = 0) -> None:
        self(
            "SystemSharedMemoryRegister",
            pb.SystemSharedMemoryRegisterRequest(
                name=name, key=key, offset=offset, byte_size=byte_size
            ),
        )

    def regions(self) -> set[str]:
        status = self("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest())
        return set(status.regions)

    def close(self) -> None:
        self.channel.close()


def simple_request(
    a: np.ndarray | None = None,
    b: np.ndarray | None = None,
    regions: Sequence[tuple[str, int]] | None = None,
    outputs: Sequence[tuple[str, str, int]] = (),
) -> pb.ModelInferRequest:
    """A request of the ``simple`` model: raw inputs, or ``regions`` (name, offset) of 64 bytes
    each; ``outputs``: (output, region, offset) written to shared memory."""
    request = pb.ModelInferRequest(model_name="simple")
    for index, name in enumerate(("INPUT0", "INPUT1")):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        if regions is not None:
            region, offset = regions[index]
            tensor.parameters["shared_memory_region"].string_param = region
            tensor.parameters["shared_memory_byte_size"].int64_param = 64
            tensor.parameters["shared_memory_offset"].int64_param = offset
        else:
            data = a if index == 0 else b
            assert data is not None
            request.raw_input_contents.append(data.astype(np.int32).tobytes())
    for output, region, offset in outputs:
        wanted = request.outputs.add(name=output)
        wanted.parameters["shared_memory_region"].string_param = region
        wanted.parameters["shared_memory_byte_size"].int64_param = 64
        wanted.parameters["shared_memory_offset"].int64_param = offset
    return request


def launches_total(daemon: RunningDaemon, token: str | None = None) -> int:
    """The daemon's count of launches (GetStatus)."""
    with grpc.insecure_channel(daemon.unix_target) as channel:
        metadata = () if token is None else (("authorization", f"Bearer {token}"),)
        status = launch_pb2_grpc.LaunchServiceStub(channel).GetStatus(
            launch_pb2.GetStatusRequest(), metadata=metadata, timeout=30
        )
    return int(status.launches_total)


def descriptors(daemon: RunningDaemon) -> int:
    """How many descriptors the daemon's process holds now."""
    return len(os.listdir(f"/proc/{daemon.process.pid}/fd"))


def shm_names() -> set[str]:
    return set(os.listdir(SHM))


def wait_until(condition: Callable[[], bool], timeout: float = 20, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


def make_object(name: str, size: int, data: bytes = b"") -> Path:
    """A shared-memory object of the test's own, as shm_open would make it."""
    path = SHM / name
    with path.open("wb") as out:
        out.write(data.ljust(size, b"\0"))
    path.chmod(0o600)
    return path


_ATTACHED = re.compile(r"kserve client attached\s+caller=uid:\d+ client_id=(\S+)")
_DROPPED = re.compile(r"kserve client dropped\s+client_id=(\S+)")


def loopback_clients(daemon: RunningDaemon) -> int:
    """How many KServe clients of loopback callers the daemon holds now (from its log)."""
    text = daemon.log.read_text(errors="replace")
    return len(set(_ATTACHED.findall(text)) - set(_DROPPED.findall(text)))
