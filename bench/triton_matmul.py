"""The daemon adds nothing to a GPU-bound kernel: a Triton-lang fp16 matmul through accy's
ring, each launch waited, against the same cubin launched in-process (same run).

    python bench/triton_matmul.py [--size 4096] [--launches 200]

Needs a GPU and ``triton`` (to compile the kernel). The in-process baseline loads the
cubin with the driver API and launches it as accy does (same grid, block and shared
memory), synchronizing after each launch; it runs in a process of its own before the
daemon starts, so the two never share the device. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))


def in_process(folder: Path, size: int, launches: int) -> list[float]:
    """Seconds per waited launch of the cubin, loaded and launched with cuda.bindings."""
    import ctypes

    from cuda.bindings import driver as cu

    def ok(result: Any) -> Any:
        if result[0]:
            raise RuntimeError(f"CUDA error {result[0]}")
        return result[1] if len(result) == 2 else result[1:]

    meta = json.loads((folder / "matmul_kernel.json").read_text())
    ok(cu.cuInit(0))
    device = ok(cu.cuDeviceGet(0))
    context = ok(cu.cuDevicePrimaryCtxRetain(device))
    ok(cu.cuCtxSetCurrent(context))
    module = ok(cu.cuModuleLoadData((folder / "matmul_kernel.cubin").read_bytes()))
    function = ok(cu.cuModuleGetFunction(module, meta["name"].encode()))
    shared = meta["shared"]
    attribute = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    ok((cu.cuFuncSetAttribute(function, attribute, shared)[0], None))
    nbytes = size * size * 2
    pointers = [ok(cu.cuMemAlloc(nbytes)) for _ in range(3)]
    rng = np.random.default_rng(1)
    for pointer in pointers[:2]:
        data = rng.standard_normal((size, size)).astype(np.float16)
        ok((cu.cuMemcpyHtoD(pointer, data.ctypes.data, nbytes)[0], None))
    values = [ctypes.c_uint64(int(p)) for p in pointers]
    values += [ctypes.c_int32(size)] * 3 + [ctypes.c_uint64(0)] * 2
    params = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
    stream = ok(cu.cuStreamCreate(1))
    grid = (-(-size // 128), -(-size // 256), 1)
    block = (32 * meta["num_warps"], 1, 1)
    times = []
    for _ in range(launches + 20):
        start = time.perf_counter()
        ok(
            (
                cu.cuLaunchKernel(
                    function, *grid, *block, shared, stream, ctypes.addressof(params), 0
                )[0],
                None,
            )
        )
        ok((cu.cuStreamSynchronize(stream)[0], None))
        times.append(time.perf_counter() - start)
    return times[20:]


def through_accy(folder: Path, size: int, launches: int) -> list[float]:
    """Seconds per waited ring launch of the same kernel through a daemon."""
    import accy
    from accy.testing import running_daemon

    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((size, size)).astype(np.float16) for _ in range(2))
    extra = ["--catalog", str(folder)]
    with (
        running_daemon(backend="cuda", tcp=False, extra=extra) as daemon,
        accy.Client(daemon.unix_target) as client,
        client.load("triton.matmul") as session,
    ):
        ins = [client.buffer(a), client.buffer(b)]
        out = client.empty((size, size), "f16")
        scalars = {"M": size, "N": size, "K": size}
        session.allocate_intermediates(**scalars)
        times = []
        for _ in range(launches + 20):
            start = time.perf_counter()
            session.launch(operands=ins, results=[out], **scalars)
            times.append(time.perf_counter() - start)
        got = out.read()
        want = a[:64].astype(np.float32) @ b.astype(np.float32)
        error = float(np.abs(got[:64].astype(np.float32) - want).max() / np.abs(want).max())
        assert error < 1e-2, f"matmul through accy is wrong: relative error {error}"
    return times[20:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--launches", type=int, default=200)
    parser.add_argument("--baseline", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline:
        print(json.dumps(in_process(args.baseline, args.size, args.launches)))
        return
    import triton_catalog

    folder = Path(tempfile.mkdtemp(prefix="accy-triton-"))
    triton_catalog.build(folder, 90)
    command = [sys.executable, __file__, "--baseline", str(folder), "--size", str(args.size)]
    command += ["--launches", str(args.launches)]
    baseline = json.loads(subprocess.run(command, check=True, capture_output=True).stdout)
    accy_times = through_accy(folder, args.size, args.launches)
    flops = 2 * args.size**3
    result = {
        "size": args.size,
        "launches": args.launches,
        "in_process_median_us": statistics.median(baseline) * 1e6,
        "accy_median_us": statistics.median(accy_times) * 1e6,
        "in_process_tflops": flops / statistics.median(baseline) / 1e12,
        "accy_tflops": flops / statistics.median(accy_times) / 1e12,
    }
    result["ratio"] = result["in_process_median_us"] / result["accy_median_us"]
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}))


if __name__ == "__main__":
    main()
