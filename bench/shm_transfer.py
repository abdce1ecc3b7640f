"""Buffer write and read through shared memory, through gRPC, and an in-process pinned copy.

Starts ``accyd serve`` (``--backend host`` or ``cuda``) on a Unix socket and,
for each size, times ``Buffer.write`` and ``Buffer.read``: through shared
memory from an array in a daemon segment (``Client.shared_array``: no copy on
the client's side), through shared memory from an ordinary array (one copy
into a pooled segment), and over gRPC (``shared_memory=False``). On CUDA it
adds the yardstick: an in-process ``cuMemcpyHtoD``/``DtoH`` of the same size
from ``cuMemHostAlloc`` memory. Best of ``--repeat`` runs, in GB/s; prints a
table last.

``--device-workers on`` serves the device from a worker process
(``ACCYD_DEVICE_WORKERS=1``): segments are then pinned and copied by the worker
from its own mapping of the same memfd; ``off`` keeps the backend in the daemon
(the default for one device).

    python bench/shm_transfer.py [--backend host|cuda] [--sizes 64M,1G] [--repeat N]
                                 [--device-workers on|off]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from accy import Client
from accy.testing import running_daemon

SIZES = {"64M": 64 << 20, "1G": 1 << 30}


def best_gbps(nbytes: int, run: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        began = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - began)
    return nbytes / best / 1e9


def through_daemon(target: str, nbytes: int, repeat: int) -> dict[str, float]:
    count = nbytes // 4
    data = np.random.default_rng(1).standard_normal(count).astype(np.float32)
    rows: dict[str, float] = {}
    with Client(target) as client:
        buffer = client.empty(count, np.float32)
        shared = client.shared_array(count, np.float32)
        shared[:] = data
        rows["shm (shared array) write"] = best_gbps(nbytes, lambda: buffer.write(shared), repeat)
        rows["shm (shared array) read"] = best_gbps(nbytes, lambda: buffer.read(out=shared), repeat)
        out = np.empty_like(data)
        rows["shm (numpy array) write"] = best_gbps(nbytes, lambda: buffer.write(data), repeat)
        rows["shm (numpy array) read"] = best_gbps(nbytes, lambda: buffer.read(out=out), repeat)
        assert np.array_equal(out, data), "the shared-memory round trip changed the data"
        buffer.free()
    with Client(target, shared_memory=False) as client:
        buffer = client.empty(count, np.float32)
        rows["gRPC write"] = best_gbps(nbytes, lambda: buffer.write(data), repeat)
        rows["gRPC read"] = best_gbps(nbytes, lambda: buffer.read(out=out), repeat)
        assert np.array_equal(out, data), "the gRPC round trip changed the data"
        buffer.free()
    return rows


def in_process_pinned(nbytes: int, repeat: int) -> dict[str, float]:
    """cuMemcpyHtoD / DtoH between ``cuMemHostAlloc`` memory and a device buffer."""
    from cuda.bindings import driver as cu  # only on CUDA hosts

    def ok(result: tuple[object, ...]) -> object:
        if result[0] != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"CUDA error {result[0]}")
        return result[1] if len(result) > 1 else None

    ok(cu.cuInit(0))
    device = ok(cu.cuDeviceGet(0))
    context = ok(cu.cuDevicePrimaryCtxRetain(device))
    ok(cu.cuCtxSetCurrent(context))
    host = ok(cu.cuMemHostAlloc(nbytes, 0))
    dev = ok(cu.cuMemAlloc(nbytes))
    try:
        rows = {
            "in-process pinned cuMemcpy write": best_gbps(
                nbytes, lambda: ok(cu.cuMemcpyHtoD(dev, host, nbytes)), repeat
            ),
            "in-process pinned cuMemcpy read": best_gbps(
                nbytes, lambda: ok(cu.cuMemcpyDtoH(host, dev, nbytes)), repeat
            ),
        }
    finally:
        ok(cu.cuMemFree(dev))
        ok(cu.cuMemFreeHost(host))
        ok(cu.cuDevicePrimaryCtxRelease(device))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["host", "cuda"], default="cuda")
    parser.add_argument("--sizes", default="64M,1G", help="comma-separated: 64M, 1G")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--device-workers",
        choices=["on", "off"],
        default="off",
        help="serve the device from a worker process (ACCYD_DEVICE_WORKERS)",
    )
    args = parser.parse_args()
    table: dict[str, dict[str, float]] = {}
    workers = {"ACCYD_DEVICE_WORKERS": "1" if args.device_workers == "on" else "0"}
    with running_daemon(backend=args.backend, tcp=False, env=workers) as daemon:
        for name in args.sizes.split(","):
            nbytes = SIZES[name]
            rows = through_daemon(daemon.unix_target, nbytes, args.repeat)
            if args.backend == "cuda":
                rows.update(in_process_pinned(nbytes, args.repeat))
            for row, gbps in rows.items():
                table.setdefault(row, {})[name] = gbps
                print(f"{name:>4} {row:<36} {gbps:7.2f} GB/s", flush=True)
    names = args.sizes.split(",")
    title = f"{args.backend} backend, device workers {args.device_workers}, GB/s"
    print(f"\n| {title} (best of {args.repeat}) | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for row, values in table.items():
        print(f"| {row} | " + " | ".join(f"{values.get(n, 0):.2f}" for n in names) + " |")


if __name__ == "__main__":
    main()
