"""Time from asking for a daemon result to its first use in CuPy: exported, against copied.

Starts ``accyd serve --backend cuda`` on a Unix socket; for each size, a client
writes x and y, launches saxpy into an exportable buffer and then, timed from
the launch's return (``wait=False``) to a CuPy reduction's value on the host:

- **export**: ``Buffer.export()`` (waits for the launch, hands over the VMM
  descriptor, maps it) then ``cupy.from_dlpack`` and ``sum``: no copy;
- **copy**: ``Buffer.read()`` (through shared memory, the fastest copy path),
  then ``cupy.asarray`` (an upload) and ``sum``: the result crosses the PCIe bus twice;
- **in-process**: the yardstick, CuPy computing ``a * x + y`` itself and ``sum``.

The export's steps are timed apart too (the RPC, the descriptor's handoff, the
CUDA import and map, DLPack, the first use). Median of ``--repeat`` runs in ms;
checks each sum; prints a table last.

    python bench/export_first_use.py [--sizes 64M,1G] [--repeat N] [--device-workers on|off]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from accy import Client, _export
from accy.testing import running_daemon

SIZES = {"4M": 4 << 20, "64M": 64 << 20, "1G": 1 << 30}


def timed(module: Any, name: str, into: list[float]) -> None:
    """Wrap ``module.name`` so each call's time (ms) is appended to ``into``."""
    original = getattr(module, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            into.append((time.perf_counter() - began) * 1000)

    setattr(module, name, wrapper)


def median_ms(run: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000


def measure(target: str, nbytes: int, repeat: int) -> dict[str, float]:
    import cupy

    count = nbytes // 4
    rng = np.random.default_rng(2)
    x = rng.standard_normal(count).astype(np.float32)
    y = rng.standard_normal(count).astype(np.float32)
    want = float(np.sum(np.float32(2.0) * x + y, dtype=np.float64))
    steps: dict[str, list[float]] = {
        "export call": [],
        "  of which the RPC": [],
        "  of which the handoff": [],
        "  of which the CUDA map": [],
        "map (DLPack)": [],
        "first use": [],
    }
    timed(_export._handoff, "take", steps["  of which the handoff"])
    timed(_export, "CudaMapping", steps["  of which the CUDA map"])
    with Client(target) as client, client.load("accy.kernel.saxpy") as session:
        bx, by = client.buffer(x), client.buffer(y)
        out = client.empty(count, np.float32, exportable=True)

        def launch() -> None:
            session.launch(operands=[bx, by], results=[out], n=count, a=2.0, wait=False)

        def exported() -> None:
            launch()
            t0 = time.perf_counter()
            view = out.export()
            t1 = time.perf_counter()
            array = cupy.from_dlpack(view)
            t2 = time.perf_counter()
            total = float(array.sum(dtype=cupy.float64))
            t3 = time.perf_counter()
            phases = ("export call", "map (DLPack)", "first use")
            for name, seconds in zip(phases, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                steps[name].append(seconds * 1000)
            inner = steps["  of which the handoff"][-1] + steps["  of which the CUDA map"][-1]
            steps["  of which the RPC"].append((t1 - t0) * 1000 - inner)
            assert abs(total - want) <= 1e-3 * max(1.0, abs(want)), (total, want)
            del array
            view.close()

        def copied() -> None:
            launch()
            total = float(cupy.asarray(out.read()).sum(dtype=cupy.float64))
            assert abs(total - want) <= 1e-3 * max(1.0, abs(want)), (total, want)

        exported()  # warm: the first export maps CUDA in this process
        copied()
        for kept in steps.values():
            kept.clear()
        rows = {
            "export, launch to first use": median_ms(exported, repeat),
            "copy (read + upload), launch to first use": median_ms(copied, repeat),
        }
        rows.update({f"  export: {name}": statistics.median(v) for name, v in steps.items()})
    gx, gy = cupy.asarray(x), cupy.asarray(y)

    def in_process() -> None:
        float((2.0 * gx + gy).sum(dtype=cupy.float64))

    in_process()
    rows["in-process CuPy a*x+y, sum"] = median_ms(in_process, repeat)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64M,1G")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--device-workers", choices=["on", "off"], default="off")
    parser.add_argument("--json", default=None, help="also write the table here")
    args = parser.parse_args()
    env = {"ACCYD_DEVICE_WORKERS": "1" if args.device_workers == "on" else "0"}
    table: dict[str, dict[str, float]] = {}
    with running_daemon(backend="cuda", tcp=False, env=env) as daemon:
        for size in args.sizes.split(","):
            table[size] = measure(daemon.unix_target, SIZES[size], args.repeat)
    print(f"export_first_use (device workers {args.device_workers}), median ms:")
    names = list(next(iter(table.values())))
    print(f"{'':45}" + "".join(f"{size:>10}" for size in table))
    for name in names:
        print(f"{name:45}" + "".join(f"{table[size][name]:10.2f}" for size in table))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(table, handle, indent=1)


if __name__ == "__main__":
    main()
