"""Isolated devices in the core: a fault costs its device's sessions and buffers only.

Two host backends stand for two devices, each "in a process of its own"
(``isolated``): the host backend is poisoned by the faulting test kernel as a
sticky CUDA error poisons a context. The fault handler swaps in a fresh backend,
as the server does with a worker's warm spare.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from accyd.backends.host import HostBackend
from accyd.catalog import load_catalog
from accyd.catalog.dtypes import DType, Scalar
from accyd.core.daemon import Daemon
from accyd.errors import DeviceFault
from accyd.telemetry.metrics import Metrics

FAULTY = Path(__file__).parents[1] / "catalogs" / "faulty"
SAXPY, FAULT = "accy.kernel.saxpy", "accy.test.fault"
N = 64


class Replacer:
    """The server's part: on a fault, a fresh backend serves the device."""

    def __init__(self) -> None:
        self.faults: list[DeviceFault] = []
        self.replaced = threading.Event()
        self.daemon: Daemon | None = None

    def __call__(self, fault: DeviceFault) -> None:
        self.faults.append(fault)
        assert self.daemon is not None and fault.device is not None
        self.daemon.replace_device(fault.device, HostBackend())
        self.replaced.set()


@pytest.fixture
def setup() -> Iterator[tuple[Daemon, Replacer]]:
    replacer = Replacer()
    daemon = Daemon(
        load_catalog([FAULTY]),
        {0: HostBackend(), 1: HostBackend()},
        on_fault=replacer,
        isolated=True,
    )
    replacer.daemon = daemon
    yield daemon, replacer
    daemon.close()


def _saxpy(daemon: Daemon, client: str, device: int) -> tuple[str, str, str]:
    """A saxpy session and its two buffers on ``device``, x = 1..N, y = 1."""
    session = daemon.load_pipeline(client, SAXPY, device=device).session_id
    x = daemon.allocate_buffer(client, N * 4, DType.F32, device).id
    y = daemon.allocate_buffer(client, N * 4, DType.F32, device).id
    _write(daemon, client, x, np.arange(1, N + 1, dtype=np.float32))
    _write(daemon, client, y, np.ones(N, dtype=np.float32))
    return session, x, y


def _write(daemon: Daemon, client: str, buffer: str, data: np.ndarray) -> None:
    transfer = daemon.open_write(client, buffer)
    transfer.write(0, data.tobytes())
    transfer.finish()


def _read(daemon: Daemon, client: str, buffer: str) -> np.ndarray:
    transfer = daemon.open_read(client, buffer)
    data = transfer.read(0, N * 4)
    transfer.finish()
    return np.frombuffer(data, dtype=np.float32)


def _launch(daemon: Daemon, client: str, session: str, x: str, y: str) -> None:
    scalars = {"n": Scalar(DType.U32, N), "a": Scalar(DType.F32, 2.0)}
    daemon.launch(client, session, [x, y], [y], scalars)
    daemon.wait_launch(client, session)


def test_a_fault_on_one_device_spares_the_other_and_the_device_serves_again(
    setup: tuple[Daemon, Replacer],
) -> None:
    daemon, replacer = setup
    both = daemon.attach("both").id
    s0, x0, y0 = _saxpy(daemon, both, 0)
    s1, x1, y1 = _saxpy(daemon, both, 1)
    faulty = daemon.attach("faulty").id
    fs = daemon.load_pipeline(faulty, FAULT, device=1).session_id
    fx = daemon.allocate_buffer(faulty, N * 4, DType.F32, 1).id
    fy = daemon.allocate_buffer(faulty, N * 4, DType.F32, 1).id

    with pytest.raises(DeviceFault) as caught:
        daemon.launch(faulty, fs, [fx], [fy], {"n": Scalar(DType.U32, N)})
        daemon.wait_launch(faulty, fs)
    assert caught.value.device == 1 and caught.value.isolated
    assert caught.value.session == fs
    assert replacer.replaced.wait(5.0), "the faulted device was never replaced"
    assert [f.device for f in replacer.faults] == [1]

    # Device 0 never noticed: its session and buffers work, with the right numbers.
    _launch(daemon, both, s0, x0, y0)
    expected = 2.0 * np.arange(1, N + 1, dtype=np.float32) + 1.0
    np.testing.assert_array_equal(_read(daemon, both, y0), expected)
    assert daemon.serving

    # What was on device 1 is lost, and says which session faulted.
    for call in (
        lambda: _launch(daemon, both, s1, x1, y1),
        lambda: _read(daemon, both, x1),
        lambda: daemon.free_buffer(both, y1),
    ):
        with pytest.raises(DeviceFault) as lost:
            call()
        assert (lost.value.device, lost.value.session, lost.value.isolated) == (1, fs, True)

    # Device 1 serves again: a new session and buffers there compute right.
    s1, x1, y1 = _saxpy(daemon, both, 1)
    _launch(daemon, both, s1, x1, y1)
    np.testing.assert_array_equal(_read(daemon, both, y1), expected)

    status = daemon.status()
    devices = {d.index: d for d in status.devices}
    assert devices[1].replacements == 1 and devices[0].replacements == 0
    assert devices[0].serving and devices[1].serving and devices[1].isolated
    assert (devices[0].sessions, devices[0].buffers) == (1, 2)
    assert (devices[1].sessions, devices[1].buffers) == (1, 2)
    # The lost buffers' memory was given back: only what is alive is charged.
    assert status.tenants[0].usage.memory_bytes == 4 * N * 4
    assert status.tenants[0].usage.buffers == 4
    metrics = Metrics()
    metrics.show(status)
    text = metrics.render()
    assert 'accy_device_replacements{device="1"} 1.0' in text
    assert 'accy_device_serving{device="1"} 1.0' in text
    assert 'accy_device_sessions{device="0"} 1.0' in text


def test_placement_spreads_clients_and_keeps_each_on_its_device(
    setup: tuple[Daemon, Replacer],
) -> None:
    daemon, _ = setup
    clients = [daemon.attach(f"c{i}").id for i in range(4)]
    placed = []
    for client in clients:
        session = daemon.load_pipeline(client, SAXPY)
        buffer = daemon.allocate_buffer(client, 1024)  # no device named: the client's
        assert buffer.device == session.device
        placed.append(session.device)
    assert sorted(placed) == [0, 0, 1, 1]
    loads = {d.index: d.clients for d in daemon.status().devices}
    assert loads == {0: 2, 1: 2}


def test_without_isolation_a_fault_stops_the_whole_daemon() -> None:
    faults: list[DeviceFault] = []
    daemon = Daemon(
        load_catalog([FAULTY]), {0: HostBackend(), 1: HostBackend()}, on_fault=faults.append
    )
    try:
        client = daemon.attach().id
        s0 = daemon.load_pipeline(client, SAXPY, device=0).session_id
        fs = daemon.load_pipeline(client, FAULT, device=1).session_id
        fx = daemon.allocate_buffer(client, N * 4, DType.F32, 1).id
        with pytest.raises(DeviceFault):
            daemon.launch(client, fs, [fx], [fx], {"n": Scalar(DType.U32, N)})
            daemon.wait_launch(client, fs)
        assert len(faults) == 1 and not faults[0].isolated
        assert not daemon.serving
        with pytest.raises(DeviceFault) as caught:
            daemon.wait_launch(client, s0)
        assert caught.value.session == fs
    finally:
        daemon.close()
