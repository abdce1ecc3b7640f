"""A ring the GPU serves, seen from its client and the daemon's CPU side (no GPU needed).

On such a ring (``SPIN_DEVICE``) nothing writes ``complete`` for the launches the GPU served,
and the daemon's engine sleeps until the GPU leaves it a record: the client's wait must
see ``done`` move by itself and kick ``submit`` once for each record left to the CPU path.
"""

from __future__ import annotations

import os
import select
import struct
import threading
from collections.abc import Callable, Iterator

import pytest

from accy._ring import Ring
from accy.protocol import ring as layout
from accyd.ring.engine.auto import open_engine
from accyd.ring.memory import RingMemory
from accyd.ring.waiting import DEVICE_SPIN_US, WaitBudget
from tests.core.daemon_fixtures import host_daemon

native = pytest.importorskip("accyd.ring.engine.native", reason="the native engine is not built")

SCALARS = struct.Struct("<I4xf4x48x")
SERVED = layout.SPIN_SET | layout.SPIN_DEVICE | 100


@pytest.fixture
def ring() -> Iterator[tuple[RingMemory, Ring]]:
    memory = RingMemory(64)
    client = Ring(*[os.dup(fd) for fd in memory.fds()])
    try:
        yield memory, client
    finally:
        client.close()
        memory.close()


def kicks(memory: RingMemory, timeout: float) -> int:
    """The kicks on ``submit`` so far (0 if none came within ``timeout``)."""
    poller = select.poll()
    poller.register(memory.submit_fd, select.POLLIN)
    if not poller.poll(timeout * 1000):
        return 0
    return os.eventfd_read(memory.submit_fd)


def test_a_wait_on_a_served_ring_kicks_once_per_left_record_and_ends_with_done(
    ring: tuple[RingMemory, Ring],
) -> None:
    memory, client = ring
    memory.set_u32(layout.WAIT_SPIN, SERVED)
    assert client.device_served
    seq = client.launch_fixed(Ring.fixed_part(1, [2], [3], 2), SCALARS, (4, 1.0), True, 1.0)
    assert kicks(memory, 0.05) == 0  # publishing alone wakes nobody: the GPU looks itself
    waited = threading.Thread(target=client.wait, args=(seq, 5.0))
    waited.start()
    assert kicks(memory, 0.2) == 0  # served by the GPU so far: no kick
    memory.set_u64(layout.LEFT, seq + 1)  # the GPU left it to the CPU path
    assert kicks(memory, 2.0) == 1
    assert kicks(memory, 0.1) == 0  # once per record left, not once per look
    memory.set_u64(layout.DONE, seq + 1)  # the CPU path finished it: nothing written to complete
    waited.join(2.0)
    assert not waited.is_alive()


def test_a_served_ring_counts_done_as_taken(ring: tuple[RingMemory, Ring]) -> None:
    memory, client = ring
    memory.set_u64(layout.DONE, 3)  # the GPU served three; the CPU path's tail did not move
    assert client.taken == 3


def test_the_wait_budget_tells_served_rings_even_when_it_is_off() -> None:
    served, other = RingMemory(16), RingMemory(16)
    try:
        budget = WaitBudget(2, cpus=2, enabled=False)
        budget.attach(served, device=True)
        budget.attach(other)
        assert served.u32(layout.WAIT_SPIN) == (
            layout.SPIN_SET | layout.SPIN_DEVICE | DEVICE_SPIN_US
        )
        assert other.u32(layout.WAIT_SPIN) == 0  # off: each client spins as it would
        on = WaitBudget(2, cpus=2)
        on.attach(served, device=True)
        on.attach(other)
        assert served.u32(layout.WAIT_SPIN) & layout.SPIN_DEVICE
        assert not other.u32(layout.WAIT_SPIN) & layout.SPIN_DEVICE
    finally:
        served.close()
        other.close()


class Said:
    """Stands in for the engine module's logger: what it said, by level."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def __getattr__(self, level: str) -> Callable[..., None]:
        return lambda event, **fields: self.lines.append((level, event))


def test_device_launch_without_a_gpu_says_so_once_and_serves_on_the_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    said = Said()  # the module's own logger may be cached by now: no capture reaches it
    monkeypatch.setattr(native, "log", said)
    daemon, _ = host_daemon()
    try:
        engine = open_engine(daemon, kind="native", device_launch=True)
        try:
            about = [line for line in said.lines if line[1].startswith("device launch")]
            assert about == [
                ("warning", "device launch is off: no CUDA device here (the host backend serves)")
            ]
            assert "device_launcher" not in engine.stats()
        finally:
            engine.close()
    finally:
        daemon.close()
