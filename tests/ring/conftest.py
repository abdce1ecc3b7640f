"""The ring tests' daemon behind a ring door on a temporary socket path: the host backend with
its rings taken by each engine in turn (the native one, and the Python loop), and the CUDA
backend with the native engine where a GPU is present, alone and with the device launcher
serving the rings (``device``: the GPU launches their ticketed records)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from accyd.backends.cuda import cuda_available
from accyd.catalog import load_catalog
from accyd.core.daemon import Daemon
from accyd.ring import RingDoor
from accyd.ring.engine.auto import EngineKind, RingEngine, open_engine
from accyd.ring.waiting import WaitBudget
from accyd.scheduling import DeviceWork
from tests.core.daemon_fixtures import host_daemon

ENGINES: list[EngineKind] = ["native", "python"]
_CUDA = [
    pytest.mark.cuda,
    pytest.mark.skipif(not cuda_available(), reason="no CUDA driver or device here"),
]


@pytest.fixture(
    params=[
        ("host", "native"),
        ("host", "python"),
        pytest.param(("cuda", "native"), marks=_CUDA, id="cuda-native"),
        pytest.param(("cuda", "device"), marks=_CUDA, id="cuda-device"),
    ],
    ids=lambda p: "-".join(p) if isinstance(p, tuple) else p,
)
def where(request: pytest.FixtureRequest) -> tuple[str, str]:
    backend, kind = request.param
    return backend, kind


@pytest.fixture
def door(tmp_path: Path, where: tuple[str, str]) -> Iterator[tuple[Daemon, RingDoor]]:
    backend_kind, engine_kind = where
    device = engine_kind == "device"
    if backend_kind == "cuda":
        from accyd.backends.cuda.backend import CudaBackend

        daemon = Daemon(load_catalog(), {0: CudaBackend(0, cache_dir=tmp_path / "cache")})
    else:
        daemon, _ = host_daemon()
    kind: EngineKind = "native" if device else engine_kind  # type: ignore[assignment]
    engine = open_engine(
        daemon,
        kind=kind,
        device_launch="always" if device else "off",
        whole_device=daemon.whole_device,
    )
    work = DeviceWork(2)
    waits = WaitBudget(engine.threads + 2) if device else None
    ring_door = RingDoor(daemon, tmp_path / "accyd.sock", engine, work=work, waits=waits)
    daemon.extend(ring_door)
    engine.start()
    ring_door.start()
    try:
        yield daemon, ring_door
    finally:
        ring_door.close()
        engine.close()
        daemon.close()
        work.close()


@pytest.fixture
def engine_of(door: tuple[Daemon, RingDoor]) -> RingEngine:
    """The engine behind ``door``."""
    engine: RingEngine = door[1]._engine  # type: ignore[assignment]
    return engine
