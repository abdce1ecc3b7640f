"""A ring the GPU serves, seen from its client and the daemon's CPU side (no GPU needed).

On such a ring (``SPIN_DEVICE``) nothing writes ``complete`` for the launches the GPU served,
and the daemon's engine sleeps until the GPU leaves it a record: the client's wait must
see ``done`` move by itself and kick ``submit`` once for each record left to the CPU path.
"""

from __future__ import annotations

import contextlib
import os
import select
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from accy._ring import Ring
from accy.protocol import ring as layout
from accyd.catalog.dtypes import DType
from accyd.ring import RingDoor
from accyd.ring.engine import device_rings
from accyd.ring.engine.auto import open_engine
from accyd.ring.memory import RingMemory
from accyd.ring.waiting import DEVICE_SPIN_US, WaitBudget
from accyd.scheduling import DeviceWork
from tests.core.daemon_fixtures import host_daemon
from tests.waiting import eventually

pytest.importorskip("accyd.ring.engine._native", reason="the native engine is not built")

SCALARS = struct.Struct("<I4xf4x48x")
SAXPY, N = "accy.kernel.saxpy", 256
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


def test_a_wait_asleep_when_its_ring_goes_to_the_gpu_follows_it(
    ring: tuple[RingMemory, Ring],
) -> None:
    memory, client = ring
    client.spin_seconds = 0.0  # asleep on ``complete`` at once
    seq = client.launch_fixed(Ring.fixed_part(1, [2], [3], 2), SCALARS, (4, 1.0), True, 1.0)
    waited = threading.Thread(target=client.wait, args=(seq, 5.0))
    waited.start()
    time.sleep(0.05)
    memory.set_u32(layout.WAIT_SPIN, SERVED)  # the daemon hands the ring to the GPU...
    memory.wake_client()  # ...and wakes its client once
    memory.set_u64(layout.LEFT, seq + 1)
    assert kicks(memory, 1.0) == 1  # the wait now follows the served ring's rules
    memory.set_u64(layout.DONE, seq + 1)
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
    monkeypatch.setattr(device_rings, "log", said)
    daemon, _ = host_daemon()
    try:
        engine = open_engine(daemon, kind="native", device_launch="always")
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


def leave_every_record(ring: Ring, stop: threading.Event) -> None:
    """Play a launcher that has no ticket for anything: leave each record to the CPU path
    (its ``left`` word) once everything before it is done, as the GPU does."""
    words = ring._words  # the ring's memory, as the GPU maps it
    while not stop.is_set():
        head, done, left = (
            words[w] for w in (layout.HEAD_WORD, layout.DONE_WORD, layout.LEFT_WORD)
        )
        if head > done and left <= done:
            words[layout.LEFT_WORD] = done + 1
        time.sleep(20e-6)


@contextlib.contextmanager
def stand_in_served(
    tmp_path: Path, mode: device_rings.DeviceLaunch, *, leaving: bool = False
) -> Iterator[tuple[Any, Ring, Callable[[], int], Any]]:
    """A native engine on the host backend whose device launcher is a stand-in (it launches
    nothing; with ``leaving``, it leaves every record to the CPU path), and a client's ring
    that asked for device waits, bound to saxpy: (the engine, the ring, a function that
    publishes one launch, the stand-in)."""
    from accyd.ring.engine.device_rings import DeviceRings
    from accyd.ring.engine.device_serving import DeviceServing
    from tests.engine.test_device_serving import Launcher

    daemon, _ = host_daemon()
    engine = open_engine(daemon, kind="native")
    launcher = Launcher()
    served = DeviceRings(engine._engine, daemon, mode, DeviceServing(0, None, launcher))  # type: ignore[attr-defined]
    engine._device = served  # type: ignore[attr-defined]
    work = DeviceWork(2)
    waits = WaitBudget(1, cpus=4)
    engine.watch_served(waits.set_device)
    door = RingDoor(daemon, tmp_path / "accyd.sock", engine, work=work, waits=waits)
    daemon.extend(door)
    engine.start()
    door.start()
    try:
        client = daemon.attach("crowd").id
        session = daemon.load_pipeline(client, SAXPY).session_id
        x = daemon.allocate_buffer(client, 4 * N, DType.F32).id
        y = daemon.allocate_buffer(client, 4 * N, DType.F32).id
        offer = door.offer(client, 64, device_waits=True)
        ring = Ring.connect(door.path, offer.ring_id, offer.ticket)
        stop = threading.Event()
        if leaving:
            threading.Thread(target=leave_every_record, args=(ring, stop), daemon=True).start()
        try:
            s, hx, hy = (ring.new_handle() for _ in range(3))
            ring.bind(layout.Kind.BIND_SESSION, s, session, 1.0)
            ring.bind(layout.Kind.BIND_BUFFER, hx, x, 1.0)
            ring.bind(layout.Kind.BIND_BUFFER, hy, y, 1.0)
            scalars = struct.pack("<I4xf4x", N, 1.0)

            def launch() -> int:
                return ring.launch(s, [hx, hy], [hy], scalars, 2, notify=True, timeout=5)

            yield engine, ring, launch, launcher
            assert ring.errors() == []
        finally:
            stop.set()
            ring.close()
    finally:
        door.close()
        engine.close()
        daemon.close()
        work.close()


def test_a_crowd_hands_rings_to_the_device_and_back_to_the_engine(tmp_path: Path) -> None:
    """``--device-launch crowd`` on the host backend with a stand-in launcher (it launches
    nothing): once crowded, the engine lets a quiet ring go and its client is told; a record
    then waits for the GPU; once the crowd is gone the engine takes the ring back and that
    record runs."""
    with stand_in_served(tmp_path, "crowd") as (engine, ring, launch, launcher):
        ring.wait(launch(), 5)
        assert not ring.device_served
        engine.crowded(True)
        assert eventually(lambda: ring.device_served, 5.0)
        waiting = launch()
        time.sleep(0.1)
        assert ring.done == waiting  # the GPU's now, and this stand-in launches nothing
        engine.crowded(False)
        ring.wait(waiting, 5)  # the engine took the ring back, and this record with it
        assert eventually(lambda: not ring.device_served)  # told just after
        assert [kind for kind, *_ in launcher.log if kind == "detach"] == ["detach"]


def test_a_served_ring_whose_client_pipelines_goes_to_the_engine_for_a_while(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher serves a ring's records one at a time: a client seen several records
    ahead of ``done`` at consecutive looks is handed to the engine, which runs what it
    published; once the hold is over, a quiet ring goes back to the device."""
    monkeypatch.setattr(device_rings, "PIPELINED_SECONDS", 0.5)
    with stand_in_served(tmp_path, "always") as (_, ring, launch, launcher):
        assert ring.device_served
        published = [launch() for _ in range(3)]  # the stand-in launches none of them
        ring.wait(published[-1], 5)  # the engine took the ring and ran all three
        assert not ring.device_served
        held_at = time.monotonic()
        assert eventually(lambda: ring.device_served, 5.0)  # the hold is over, the ring quiet
        assert time.monotonic() - held_at >= 0.3
        assert [kind for kind, *_ in launcher.log if kind == "detach"] == ["detach"]


def test_a_served_ring_stays_served_through_the_records_it_leaves_to_the_cpu(
    tmp_path: Path,
) -> None:
    """A client's first launch comes after its binds, which the launcher leaves to the CPU
    path one at a time, so for a moment it is several records ahead of ``done``: that is not
    pipelining, and its ring stays with the device (the engine's slow path runs after each
    left record; the looks for pipelining must not)."""
    with stand_in_served(tmp_path, "always", leaving=True) as (_, ring, launch, launcher):
        for _ in range(20):
            ring.wait(launch(), 5)  # waited: never more than one ahead
            assert ring.device_served
        time.sleep(3 * device_rings.DEPTH_LOOK_SECONDS)
        assert ring.device_served
        assert [kind for kind, *_ in launcher.log if kind == "detach"] == []
