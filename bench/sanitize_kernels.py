"""Every built-in CUDA kernel at small edge sizes in exact-size buffers, for compute-sanitizer.

    PYTHONPATH=server:client compute-sanitizer --tool memcheck python3 bench/sanitize_kernels.py

Prints one line per kernel and size and exits non-zero on a wrong result; the
sanitizer reports any access outside the allocations, races and uninitialized reads.
"""

from __future__ import annotations

import sys
import tempfile

import numpy as np

from accyd.backends.base import ArtifactRequest, DeviceBuffer, LaunchRequest
from accyd.backends.cuda import CudaBackend
from accyd.catalog import ArtifactFormat, Scalar, load_catalog
from accyd.catalog.model import check_geometry
from accyd.core.executor import allocate_intermediates

TILE = 4096
N_SIZES = [1, 63, 4097, 5000, 8193, 70001]
M_SIZES = [1, 65, 5000, 16385, 40001]


def main() -> int:
    catalog = load_catalog()
    scan = catalog.find_pipeline("accy.kernel.device_scan")
    failures = 0
    with tempfile.TemporaryDirectory() as cache, CudaBackend(0, cache_dir=cache) as be:
        kernels = {}
        for entry in catalog.registry.entries:
            if entry.format is not ArtifactFormat.CUDA_CPP:
                continue
            artifact = be.create_artifact(
                ArtifactRequest(entry.entry_name, entry.format, entry.argument_count,
                                entry.scalar_argument_count(), entry.payload, origin=entry.origin)
            )  # fmt: skip
            kernels[entry.target] = (entry, be.load_artifact(artifact))

        def run(target: str, buffers: list[DeviceBuffer], scalars: list[Scalar]) -> None:
            entry, loaded = kernels[target]
            geometry = entry.launch.resolve(scalars)
            check_geometry(geometry)
            be.launch(LaunchRequest(None, loaded, buffers, scalars, geometry))
            be.synchronize()

        def up(a: np.ndarray) -> DeviceBuffer:
            b = be.allocate_buffer(a.nbytes)
            be.write(b, 0, memoryview(a), None)
            return b

        def down(b: DeviceBuffer, count: int) -> np.ndarray:
            return np.frombuffer(be.read(b, 0, count * 4, None), dtype=np.float32)

        def report(name: str, size: int, err: float, tol: float) -> None:
            nonlocal failures
            good = bool(np.isfinite(err) and err < tol)
            failures += not good
            print(f"{name:14s} {size:7d} rel_err={err:.2e} {'ok' if good else 'WRONG'}")

        rng = np.random.default_rng(0)
        for n in N_SIZES:
            m = -(-n // TILE)
            x = rng.random(n, dtype=np.float32) - np.float32(0.25)
            y = rng.random(n, dtype=np.float32)
            nan = np.full(n, np.nan, dtype=np.float32)
            dx, dy = up(x), up(y)
            dsums, doff, dout, dtot = (
                up(nan[:m].copy()),
                up(nan[:m].copy()),
                up(nan),
                up(nan[:1].copy()),
            )
            run("accy.kernel.scan.tile_sum", [dsums, dx], [Scalar.u32(n)])
            run("accy.kernel.scan.tile_offsets", [doff, dsums], [Scalar.u32(m)])
            run("accy.kernel.scan.tile_scan", [dout, dx, doff], [Scalar.u32(n)])
            run("accy.kernel.reduce.final_sum", [dtot, dsums], [Scalar.u32(m)])
            want = np.cumsum(x, dtype=np.float64)
            got = down(dout, n)
            report("tile scans", n, float(np.linalg.norm(got - want) / np.linalg.norm(want)), 1e-5)
            # device_scan's one pass, twice on the same exact-size scratch (the state the
            # first leaves is the second's), the partials never written before the kernel
            # (made as a session's is, from the pipeline's manifest: state, then partials)
            scratch = allocate_intermediates(be, scan, [Scalar.u32(n)])
            for time in (1, 2):
                be.write(dout, 0, memoryview(nan), None)
                run("accy.kernel.scan.single_pass", [dout, *scratch.buffers, dx], [Scalar.u32(n)])
                got = down(dout, n)
                err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
                report(f"device_scan #{time}", n, err, 1e-5)
            scratch.close()
            total = float(down(dtot, 1)[0])
            report("reduce_sum", n, abs(total - want[-1]) / abs(want[-1]), 1e-5)
            run("accy.kernel.saxpy", [dout, dx, dy], [Scalar.u32(n), Scalar.f32(2.0)])
            want = 2.0 * x.astype(np.float64) + y
            report(
                "saxpy", n, float(np.linalg.norm(down(dout, n) - want) / np.linalg.norm(want)), 1e-6
            )
            run("accy.kernel.saxpy", [dx, dx, dy], [Scalar.u32(n), Scalar.f32(2.0)])
            report(
                "saxpy inplace",
                n,
                float(np.linalg.norm(down(dx, n) - want) / np.linalg.norm(want)),
                1e-6,
            )
            for b in (dx, dy, dsums, doff, dout, dtot):
                be.destroy(b)
        for m in M_SIZES:
            sums = (rng.random(m, dtype=np.float32) - np.float32(0.25)) * np.float32(4096)
            ds, do, dt = (
                up(sums),
                up(np.full(m, np.nan, dtype=np.float32)),
                up(np.full(1, np.nan, dtype=np.float32)),
            )
            run("accy.kernel.scan.tile_offsets", [do, ds], [Scalar.u32(m)])
            run("accy.kernel.reduce.final_sum", [dt, ds], [Scalar.u32(m)])
            want = np.concatenate([[0.0], np.cumsum(sums, dtype=np.float64)[:-1]])
            got = down(do, m)
            err = float(np.linalg.norm(got - want) / (np.linalg.norm(want) or 1.0))
            report("tile_offsets", m, err, 1e-5)
            ref = sums.sum(dtype=np.float64)
            report("final_sum", m, abs(float(down(dt, 1)[0]) - ref) / abs(ref), 1e-5)
            for b in (ds, do, dt):
                be.destroy(b)
        for _, loaded in kernels.values():
            be.destroy(loaded)
        print(f"memory in use at end: {be.memory_in_use()}")
    print("SANITIZE-RUN", "FAILED" if failures else "PASSED", failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
