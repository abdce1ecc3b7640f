"""Fixtures for the device worker tests: workers on the host backend, test kernels, gates.

A kernel cannot share a ``threading.Event`` with the test across the process
boundary, so ``blocked`` waits for a gate file instead: ``Kernels.gate(n)``
opens gate ``n`` (the kernel's first scalar names its gate).
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from accyd.backends.base import (
    ArtifactRequest,
    Backend,
    DeviceBuffer,
    LaunchRequest,
    LoadedKernel,
    Stream,
)
from accyd.backends.worker.front.proxy import WorkerBackend
from accyd.catalog import ArtifactFormat, Scalar
from accyd.catalog.model import FixedGeometry

ONE = FixedGeometry((1, 1, 1), (1, 1, 1))

KERNELS = """
import os
import time

from accyd.errors import DeviceFault

GATES = {gates!r}

def append(grid, block, buffers, scalars):
    # Writes scalars[0] at the next free slot: the order of launches shows in the buffer.
    view = buffers[0].view("uint32")
    count = int(view[0])
    view[count + 1] = int(scalars[0])
    view[0] = count + 1

def blocked(grid, block, buffers, scalars):
    # Holds its stream until the test opens gate scalars[0] (10 s at most).
    gate = os.path.join(GATES, str(int(scalars[0])))
    deadline = time.monotonic() + 10
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.001)

def boom(grid, block, buffers, scalars):
    raise ZeroDivisionError("planted")

def fault(grid, block, buffers, scalars):
    raise DeviceFault("planted")
"""

_GATE_NUMBERS = itertools.count(1)


class Kernels:
    """The test kernels loaded on one backend, and the gates ``blocked`` waits for."""

    def __init__(self, backend: Backend, gates: Path) -> None:
        self.backend = backend
        self.gates = gates
        source = KERNELS.format(gates=str(gates))
        self.loaded: dict[str, LoadedKernel] = {}
        for name in ("append", "blocked", "boom", "fault"):
            request = ArtifactRequest(name, ArtifactFormat.HOST_PY, 1, 1, source, origin="test")
            artifact = backend.create_artifact(request)
            self.loaded[name] = backend.load_artifact(artifact)
            artifact.close()

    def launch(
        self,
        name: str,
        stream: Stream | None,
        buffers: Sequence[DeviceBuffer] = (),
        value: int = 0,
    ) -> None:
        request = LaunchRequest(
            None, self.loaded[name], list(buffers), [Scalar.u32(value)], ONE, stream
        )
        self.backend.launch(request)

    def new_gate(self) -> int:
        return next(_GATE_NUMBERS)

    def open(self, gate: int) -> None:
        (self.gates / str(gate)).touch()


def worker_children() -> set[int]:
    """Pids of this process's children running the device worker, and of any child left a
    zombie (not reaped: its command line is gone), from /proc."""
    found = set()
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        state, parent = stat.rsplit(")", 1)[1].split()[:2]
        if int(parent) == me and (state == "Z" or b"accyd.backends.worker.child.main" in cmdline):
            found.add(int(entry.name))
    return found


def gone(pid: int) -> bool:
    """Whether process ``pid`` has exited and been reaped (no zombie left)."""
    return not Path(f"/proc/{pid}").exists()


@pytest.fixture(scope="module")
def gates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gates")


@pytest.fixture(scope="module")
def shared() -> Iterator[WorkerBackend]:
    """One host worker for the tests that leave it healthy (a start costs ~0.5 s here)."""
    backend = WorkerBackend("host", 0, host_memory_limit=64 << 20)
    yield backend
    backend.close()
    assert backend.reaped


@pytest.fixture(scope="module")
def kernels(shared: WorkerBackend, gates: Path) -> Kernels:
    return Kernels(shared, gates)


class Traffic:
    """What moved between the front and one worker meanwhile (``traffic``)."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        self.sent = 0
        """Bytes the front sent through the channel's socket."""
        self.received = 0
        """Bytes of ``DATA`` frames (a read's bytes) the front received."""
        self.calls: list[int] = []
        """The opcode of each round trip, in order."""

    def sendall(self, data: Any) -> None:
        self.sent += memoryview(data).nbytes
        self.sock.sendall(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


@contextlib.contextmanager
def traffic(backend: WorkerBackend) -> Iterator[Traffic]:
    """Count what moves through ``backend``'s channel within the block (test only: it wraps
    the channel's socket and its ``call``)."""
    channel = backend._channel
    counted = Traffic(channel._sock)
    call = channel.call

    def counting_call(build: Callable[[int], tuple[Any, ...]], **options: Any) -> Any:
        counted.calls.append(build(0)[0])
        sink = options.get("sink")
        if sink is not None:

            def counting_sink(chunk: Any) -> None:
                counted.received += memoryview(chunk).nbytes
                sink(chunk)

            options["sink"] = counting_sink
        return call(build, **options)

    channel._sock = counted  # type: ignore[assignment]
    channel.call = counting_call  # type: ignore[method-assign]
    try:
        yield counted
    finally:
        channel._sock = counted.sock
        del channel.call
