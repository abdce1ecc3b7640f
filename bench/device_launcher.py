"""The device launcher through accy's own rings and client: waited launches per second.

What ``bench/device_sched.cu`` measured with a ticket that was a count, this measures with
accy's pieces: client processes each publish launch records through ``accy._ring.Ring``
(``launch_fixed``, the client's one launch path) into a ring the daemon's ``RingMemory``
made, and spin (yielding) on ``done``; the launcher (``DeviceLauncher``) reads each record
over PCIe, matches its 136 launch bytes against the ring's device tickets, and launches the
ticket's graph (the sharing benchmark's 8-block ``accy_bench_fma``) from the GPU. So this
is the prototype plus what it left out: reading the record and looking it up.

Each count runs in processes of its own: the clients are forked before the GPU's process
starts CUDA. One JSON line per count.

    python bench/device_launcher.py --clients 1,8,32 --seconds 1 --kernel-us 8
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import multiprocessing
import os
import struct
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "server"), str(ROOT / "client")]

from accy._ring import Ring  # noqa: E402
from accyd.ring.memory import RingMemory  # noqa: E402

BUCKETS = 20000
"""1 µs each."""
MAX_CLIENTS = 128
WARM = 0.2
GO_WAIT = 60.0
STALL = 2.0
"""A client that sees no progress this long gives up (the count then reports it)."""
GO, GAVE_UP, GPU_DONE, REPORT_LEN = 0, 1, 2, 3
"""u32 words at the shared block's start."""
REPORT, COUNTS = 1024, 16384
HIST = COUNTS + 8 * MAX_CLIENTS
SHARED_BYTES = HIST + 4 * MAX_CLIENTS * BUCKETS
FIXED_SCALARS = struct.Struct("<64x")


def _client(memory_fds: list[int], index: int, shared: mmap.mmap, seconds: float) -> None:
    """One client process: launch, wait for ``done`` (spinning, yielding), time it."""
    words = np.frombuffer(shared, np.uint32, 4)
    counts = np.frombuffer(shared, np.int64, MAX_CLIENTS, COUNTS)
    hist = np.frombuffer(shared, np.uint32, MAX_CLIENTS * BUCKETS, HIST).reshape(
        MAX_CLIENTS, BUCKETS
    )
    ring = Ring(*(os.dup(fd) for fd in memory_fds))
    fixed = Ring.fixed_part(index + 1, [1], [2], 0)
    asked = time.monotonic()
    while not words[GO]:
        os.sched_yield()
        if time.monotonic() - asked > GO_WAIT:
            words[GAVE_UP] += 1
            return
    now = time.perf_counter
    timed_from = now() + WARM
    end = timed_from + seconds
    mine = hist[index]
    count = 0
    while True:
        t0 = now()
        if t0 >= end:
            break
        seq = ring.launch_fixed(fixed, FIXED_SCALARS, (), False, 1.0)
        while ring.done <= seq:
            os.sched_yield()
            if now() - t0 > STALL:
                words[GAVE_UP] += 1
                counts[index] = count
                return
        if t0 >= timed_from:
            us = int((now() - t0) * 1e6)
            mine[min(us, BUCKETS - 1)] += 1
            count += 1
    counts[index] = count
    ring.close()


def _gpu(memories: list[RingMemory], shared: mmap.mmap, seconds: float, kernel_us: float) -> None:
    """The GPU's process: the launcher, each client's ticket, then the count's run."""
    from accyd.backends.cuda.backend import CudaBackend
    from accyd.backends.cuda.device_launcher import DeviceLauncher

    words = np.frombuffer(shared, np.uint32, 4)
    report: dict[str, Any] = {}
    backend = CudaBackend(0)
    cu, check = backend._cu, backend._check
    launcher: DeviceLauncher | None = None
    try:
        launcher = DeviceLauncher(backend)
        source = (ROOT / "bench" / "catalog" / "fma.cu").read_text()
        image = backend.cache.compile(source, arch=backend.compute_capability)
        module = check(cu.cuModuleLoadData(image.data), "load")
        fma = check(cu.cuModuleGetFunction(module, b"accy_bench_fma"), "fma")
        x = int(check(cu.cuMemAlloc(4096), "alloc"))
        y = int(check(cu.cuMemAlloc(4096 * len(memories)), "alloc"))
        check(cu.cuMemsetD32(x, 0, 1024), "memset")
        stream = check(cu.cuStreamCreate(1), "stream")
        types = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint)

        def run(out: int, iters: int, s: Any, count: int = 1) -> None:
            for _ in range(count):
                launch = cu.cuLaunchKernel(
                    fma, 8, 1, 1, 128, 1, 1, 0, s, ((out, x, iters), types), 0
                )
                check(launch, "accy_bench_fma")

        def kernel_time(iters: int) -> float:
            start, stop = check(cu.cuEventCreate(0), "event"), check(cu.cuEventCreate(0), "event")
            run(y, iters, stream)
            check(cu.cuEventRecord(start, stream), "record")
            run(y, iters, stream, 100)
            check(cu.cuEventRecord(stop, stream), "record")
            check(cu.cuEventSynchronize(stop), "sync")
            return float(check(cu.cuEventElapsedTime(start, stop), "elapsed")) * 10.0

        lo, hi = 1, 1 << 20
        while lo < hi:  # the fewest iterations that run kernel_us
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if kernel_time(mid) < kernel_us else (lo, mid)
        report["kernel_us"] = round(kernel_time(lo), 2)
        graphs = []
        for i, memory in enumerate(memories):
            slot = launcher.attach(memory.map, memory.slot_count)
            out = y + 4096 * i
            graph = launcher.graph(slot, lambda s, o=out: run(o, lo, s.native))
            graphs.append((slot, graph))
            epoch = launcher.new_epoch()
            key = Ring.fixed_part(i + 1, [1], [2], 0)[4:] + bytes(64)
            launcher.put_ticket(slot, key, graph, epoch, launcher.epoch_value(epoch))
        words[GO] = 1
        time.sleep(WARM + seconds + 0.3)
        report.update(launcher.stats())
        report["failure"] = launcher.failure
        for slot, graph in graphs:
            launcher.detach(slot)
            graph.close()
    except Exception as error:
        report["error"] = f"{type(error).__name__}: {error}"
    finally:
        words[GO] = 1  # clients waiting for a start that failed end at once
        if launcher is not None:
            launcher.close()
        backend.close()
    data = json.dumps(report).encode()
    shared[REPORT : REPORT + len(data)] = data
    words[REPORT_LEN] = len(data)
    words[GPU_DONE] = 1


def _percentile(hist: np.ndarray, q: float) -> float:
    total = hist.sum()
    if not total:
        return 0.0
    return float(np.searchsorted(np.cumsum(hist), q * total)) + 0.5


def count(n: int, seconds: float, kernel_us: float) -> dict[str, Any]:
    shared = mmap.mmap(-1, SHARED_BYTES)
    memories = [RingMemory(64) for _ in range(n)]
    fork = multiprocessing.get_context("fork")
    clients = [
        fork.Process(target=_client, args=(m.fds(), i, shared, seconds))
        for i, m in enumerate(memories)
    ]
    for process in clients:
        process.start()
    gpu = fork.Process(target=_gpu, args=(memories, shared, seconds, kernel_us))
    gpu.start()
    for process in [*clients, gpu]:
        process.join(GO_WAIT + seconds + 30)
    words = np.frombuffer(shared, np.uint32, 4)
    report = json.loads(bytes(shared[REPORT : REPORT + int(words[REPORT_LEN])]) or b"{}")
    counts = np.frombuffer(shared, np.int64, n, COUNTS)
    hist = np.frombuffer(shared, np.uint32, n * BUCKETS, HIST).reshape(n, BUCKETS).sum(axis=0)
    total = int(counts.sum())
    line = {
        "kind": "device_launcher",
        "clients": n,
        "kernels_per_s": round(total / seconds),
        "p50_us": _percentile(hist, 0.5),
        "p99_us": _percentile(hist, 0.99),
        "slowest_over_mean": round(float(counts.min()) * n / total, 3) if total else 0.0,
        "gave_up": int(words[GAVE_UP]),
        "failed": bool(words[GAVE_UP]) or "error" in report or gpu.exitcode != 0,
        **report,
    }
    for memory in memories:
        memory.close()
    return line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--kernel-us", type=float, default=8.0)
    args = parser.parse_args()
    failed = False
    for n in (int(c) for c in args.clients.split(",")):
        if not 1 <= n <= MAX_CLIENTS:
            parser.error(f"clients are 1..{MAX_CLIENTS}")
        line = count(n, args.seconds, args.kernel_us)
        failed = failed or line["failed"]
        print(json.dumps(line), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
