"""The device launcher serves real rings: a client's records launch checked graphs from the GPU.

A client publishes launch records through accy's own client ring (``accy._ring.Ring``) into a
ring the daemon made (``RingMemory``); the launcher, a resident kernel, matches each record's
bytes against its ring's device tickets and launches the ticket's graph from the device, and
the graph's last node publishes ``done``. No daemon thread is on that path. What the
launcher must not launch (no ticket, a revoked or dropped one, a record that is not a
launch) it leaves to the CPU path and launches nothing.
"""

from __future__ import annotations

import ctypes
import os
import statistics
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from accy._ring import Ring
from accy.protocol import ring as layout
from accyd.backends.cuda import cuda_available
from accyd.errors import RuntimeUnavailable
from accyd.ring.memory import RingMemory

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not cuda_available(), reason="no CUDA driver or device here"),
]

N = 1024
AXPY = r"""
extern "C" __global__ void axpy(float a, const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}
"""
SESSION, X, Y = 7, 1, 2


class Rig:
    """One backend, its launcher, an axpy kernel and its buffers, and a ring with a client."""

    def __init__(self, tmp: Path) -> None:
        from accyd.backends.cuda.backend import CudaBackend
        from accyd.backends.cuda.device_launcher import DeviceLauncher

        self.backend = CudaBackend(0, cache_dir=tmp)
        try:
            self.launcher = DeviceLauncher(self.backend)
        except RuntimeUnavailable as error:
            self.backend.close()
            pytest.skip(f"no device launcher here: {error}")
        self.cu = cu = self.backend._cu
        check = self.backend._check
        image = self.backend.cache.compile(AXPY, arch=self.backend.compute_capability)
        self.module = check(cu.cuModuleLoadData(image.data), "load")
        self.axpy = check(cu.cuModuleGetFunction(self.module, b"axpy"), "axpy")
        self.x = int(check(cu.cuMemAlloc(4 * N), "alloc"))
        self.y = int(check(cu.cuMemAlloc(4 * N), "alloc"))
        ones = np.ones(N, np.float32)
        check(cu.cuMemcpyHtoD(self.x, ones, 4 * N), "HtoD")
        check(cu.cuMemsetD32(self.y, 0, N), "memset")
        self.memory = RingMemory(64)
        self.client = Ring(*(os.dup(fd) for fd in self.memory.fds()))
        self.client.spin_seconds = 5.0  # nothing wakes a sleeper on this path: spin
        self.slot = self.launcher.attach(self.memory.map, self.memory.slot_count)

    def enqueue_axpy(self, a: float) -> Any:
        def enqueue(stream: Any) -> None:
            args = (a, self.x, self.y, N)
            types = (ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)
            self.backend._check(
                self.cu.cuLaunchKernel(
                    self.axpy, (N + 127) // 128, 1, 1, 128, 1, 1, 0, stream.native, (args, types), 0
                ),
                "axpy",
            )

        return enqueue

    def key(self, a: float) -> bytes:
        """The launch bytes of a record of ``SESSION`` on X and Y with scalar ``a``."""
        fixed = Ring.fixed_part(SESSION, [X], [Y], 1)
        return fixed[4:] + struct.pack("<f", a).ljust(8 * layout.MAX_SCALARS, b"\0")

    def launch(self, a: float) -> int:
        return self.client.launch(
            SESSION, [X], [Y], struct.pack("<f", a), 1, notify=True, timeout=1.0
        )

    def y_values(self) -> np.ndarray:
        out = np.empty(N, np.float32)
        self.backend._check(self.cu.cuMemcpyDtoH(out, self.y, 4 * N), "DtoH")
        return out

    def close(self) -> None:
        self.launcher.close()
        self.client.close()
        self.memory.close()
        self.cu.cuMemFree(self.x)
        self.cu.cuMemFree(self.y)
        self.cu.cuModuleUnload(self.module)
        self.backend.close()


@pytest.fixture()
def rig(tmp_path: Path) -> Iterator[Rig]:
    made = Rig(tmp_path)
    try:
        yield made
    finally:
        made.close()


def _left(rig: Rig, seq: int, timeout: float = 2.0) -> bool:
    """Whether the launcher left record ``seq`` to the CPU path within ``timeout``, in its
    table and in the ring's own ``left`` word (what the client and the engine read)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ring_word = struct.unpack_from("<Q", rig.memory.map, layout.LEFT)[0]
        if rig.launcher.ring_state(rig.slot).left == seq + 1 and ring_word == seq + 1:
            return True
        time.sleep(1e-3)
    return False


def _cpu_path_finishes(rig: Rig, seq: int) -> None:
    """What the CPU path does with a record it checked and refused: ``done`` passes it."""
    rig.memory.set_u64(layout.DONE, seq + 1)


def test_ticketed_records_launch_from_the_device_and_publish_done(rig: Rig) -> None:
    graph = rig.launcher.graph(rig.slot, rig.enqueue_axpy(2.0))
    epoch = rig.launcher.new_epoch()
    rig.launcher.put_ticket(rig.slot, rig.key(2.0), graph, epoch, rig.launcher.epoch_value(epoch))
    took: list[float] = []
    rounds = 300
    for _ in range(rounds):
        began = time.perf_counter()
        seq = rig.launch(2.0)
        rig.client.wait(seq, timeout=5.0)
        took.append(time.perf_counter() - began)
    np.testing.assert_array_equal(rig.y_values(), np.full(N, 2.0 * rounds, np.float32))
    stats = rig.launcher.stats()
    assert stats["launched"] == rounds and stats["errors"] == 0 and stats["left"] == 0, stats
    assert stats["graph_ns"] > 0 and stats["launch_ns"] > 0 and stats["look_ns"] > 0, stats
    assert rig.launcher.ring_state(rig.slot).launched == rounds
    print(f"device-launched waited axpy: p50 {statistics.median(took) * 1e6:.1f} µs", stats)
    rig.launcher.detach(rig.slot)
    graph.close()


def test_what_has_no_live_ticket_is_left_to_the_cpu_path_and_never_launched(rig: Rig) -> None:
    graph = rig.launcher.graph(rig.slot, rig.enqueue_axpy(1.0))
    epoch = rig.launcher.new_epoch()
    index = rig.launcher.put_ticket(
        rig.slot, rig.key(1.0), graph, epoch, rig.launcher.epoch_value(epoch)
    )
    served = 0

    def served_one() -> None:
        nonlocal served
        seq = rig.launch(1.0)
        rig.client.wait(seq, timeout=5.0)
        served += 1

    def left_one(a: float = 1.0) -> None:
        seq = rig.launch(a)
        assert _left(rig, seq), f"record {seq} was neither served nor left"
        assert rig.client.done == seq  # nothing published it: no graph ran
        _cpu_path_finishes(rig, seq)

    served_one()
    left_one(3.0)  # other scalar bytes: no ticket has them
    served_one()  # the launcher goes on once the CPU path passed the left record
    rig.launcher.revoke([epoch])
    left_one()  # a revoked epoch: the ticket is stale
    again = rig.launcher.put_ticket(
        rig.slot, rig.key(1.0), graph, epoch, rig.launcher.epoch_value(epoch)
    )
    assert again != index  # the stale one is still in its place
    rig.launcher.drop_ticket(rig.slot, index)
    served_one()  # checked again, against the new value
    rig.launcher.drop_ticket(rig.slot, again)
    left_one()  # no ticket at all
    # A freed place takes another ticket, with another graph: its records launch that one.
    other = rig.launcher.graph(rig.slot, rig.enqueue_axpy(3.0))
    reused = rig.launcher.put_ticket(
        rig.slot, rig.key(3.0), other, epoch, rig.launcher.epoch_value(epoch)
    )
    assert reused in (index, again)
    for _ in range(2):
        rig.client.wait(rig.launch(3.0), timeout=5.0)
    seq = rig.client.bind(layout.Kind.BIND_BUFFER, 9, "buffer-9", timeout=1.0)
    assert _left(rig, seq)  # not a launch: only the CPU path binds
    _cpu_path_finishes(rig, seq)
    want = float(served) + 2 * 3.0
    np.testing.assert_array_equal(rig.y_values(), np.full(N, want, np.float32))
    stats = rig.launcher.stats()
    assert stats["launched"] == served + 2 and stats["errors"] == 0 and stats["left"] == 4, stats
    rig.launcher.detach(rig.slot)
    rig.memory.close()  # detached: the map is no longer exported, so it may close
    graph.close()
    other.close()


def test_an_idle_launcher_keeps_ending_its_runs_and_closes_cleanly(rig: Rig) -> None:
    time.sleep(0.2)
    first = rig.launcher.stats()
    time.sleep(0.2)
    later = rig.launcher.stats()
    assert later["runs"] > first["runs"] and later["relaunches"] > first["relaunches"]
    assert rig.launcher.failure is None
    rig.launcher.close()
    rig.launcher.close()  # idempotent
