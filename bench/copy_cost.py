"""Where a shared-memory copy's time goes: the call's fixed cost against the bytes moved.

Starts ``accyd serve`` (``--backend host`` or ``cuda``) on a Unix socket and times,
median of ``--repeat``: a ``Ping`` round trip (the gRPC floor); ``Buffer.write`` and
``read`` of 4 KiB from a shared array (the copy call's fixed cost) and of 64 MiB; on
CUDA, in this process, ``cuMemcpyHtoD``/``DtoH`` of 64 MiB from a ``memfd`` mapping
page-locked with ``cuMemHostRegister`` (what the daemon's copy itself can reach) and
from ``cuMemHostAlloc`` memory. Prints a table in µs last.

    python bench/copy_cost.py [--backend host|cuda] [--repeat N] [--device-workers on|off]
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

from accy import Client
from accy.protocol.launch.v1 import launch_pb2 as pb
from accy.testing import running_daemon

BIG = 64 << 20


def median_us(run: Callable[[], object], repeat: int) -> float:
    run()
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e6


def through_daemon(target: str, repeat: int) -> dict[str, float]:
    rows: dict[str, float] = {}
    with Client(target) as client:
        conn = client._conn
        rows["Ping round trip"] = median_us(
            lambda: conn.call(conn.stub.Ping, pb.PingRequest()), repeat
        )
        for label, count in (("4 KiB", 1024), ("64 MiB", BIG // 4)):
            buffer = client.empty(count, np.float32)
            shared = client.shared_array(count, np.float32)
            write, read = buffer.write, buffer.read
            rows[f"shared write {label}"] = median_us(lambda w=write, s=shared: w(s), repeat)
            rows[f"shared read {label}"] = median_us(lambda r=read, s=shared: r(out=s), repeat)
            buffer.free()
    return rows


def in_process(repeat: int) -> dict[str, float]:
    from cuda.bindings import driver as cu

    def ok(result: tuple[object, ...]) -> object:
        if result[0] != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"CUDA error {result[0]}")
        return result[1] if len(result) > 1 else None

    ok(cu.cuInit(0))
    context = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))
    ok(cu.cuCtxSetCurrent(context))
    device = int(ok(cu.cuMemAlloc(BIG)))  # type: ignore[call-overload]
    stream = ok(cu.cuStreamCreate(1))
    fd = os.memfd_create("copy-cost")
    os.ftruncate(fd, BIG)
    mapped = mmap.mmap(fd, BIG)
    view = np.frombuffer(mapped, dtype=np.uint8)
    view[:] = 1
    address = int(view.ctypes.data)
    ok(cu.cuMemHostRegister(address, BIG, 0))
    host = int(ok(cu.cuMemHostAlloc(BIG, 0)))  # type: ignore[call-overload]
    rows = {}
    for label, source in (("registered memfd", address), ("cuMemHostAlloc", host)):

        def h2d(source: int = source) -> None:
            ok(cu.cuMemcpyHtoDAsync(device, source, BIG, stream))
            ok(cu.cuStreamSynchronize(stream))

        def d2h(source: int = source) -> None:
            ok(cu.cuMemcpyDtoHAsync(source, device, BIG, stream))
            ok(cu.cuStreamSynchronize(stream))

        rows[f"in-process {label} write 64 MiB"] = median_us(h2d, repeat)
        rows[f"in-process {label} read 64 MiB"] = median_us(d2h, repeat)
    ok(cu.cuMemHostUnregister(address))
    ok(cu.cuMemFreeHost(host))
    ok(cu.cuMemFree(device))
    del view
    mapped.close()
    os.close(fd)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["host", "cuda"], default="host")
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--device-workers", choices=["on", "off"], default="off")
    args = parser.parse_args()
    env = {"ACCYD_DEVICE_WORKERS": "1" if args.device_workers == "on" else "0"}
    with running_daemon(backend=args.backend, tcp=False, env=env) as daemon:
        rows = through_daemon(daemon.unix_target, args.repeat)
    if args.backend == "cuda":
        rows.update(in_process(args.repeat))
    print(f"copy_cost ({args.backend}, device workers {args.device_workers}), median µs:")
    for name, value in rows.items():
        print(f"  {name:42} {value:10.1f}")


if __name__ == "__main__":
    main()
