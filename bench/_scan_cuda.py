"""device_scan's kernel launched in one process, raw: the fair baseline for its round trip.

The worker (kind ``cuda-scan``) compiles the daemon's own ``scan.cu`` with the daemon's
NVRTC options, allocates x, y and the scratch once, and times, each waited for on one
stream: device_scan's one kernel (the single pass) with ``cuLaunchKernel`` and a
``cuStreamSynchronize``; the same kernel captured once in a CUDA graph, ``cuGraphLaunch``
and a synchronize (what accy's launch path replays); the reduce-then-scan kernels
device_scan ran before (tile sums, their scan, the scan with offsets: three launches and a
synchronize); and the sharing benchmark's one tiny kernel launched and synchronized (the
bound the issue states device_scan against) and the same captured in a graph (what accy
replays for it, so accy's own cost is each series over its graph). Every driver call's
result is checked, and y is checked against numpy's cumulative sum after each way.
"""

from __future__ import annotations

import ctypes
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
from _sharing_cuda import Rig
from bench_service import _percentiles, _timed

from accyd.backends.cuda.compile_cache import CompileCache
from accyd.backends.cuda.driver import check
from accyd.catalog import ArtifactFormat, Scalar, load_catalog
from accyd.catalog.catalog import BUILTIN_CATALOG

SOURCE = BUILTIN_CATALOG / "cuda" / "scan.cu"
TILE, TILE_THREADS, OFFSETS_THREADS = 4096, 256, 1024
"""scan.cu's tile kernels' tile, their block and tile_offsets' (one block)."""
CATALOG = load_catalog()
SCAN = CATALOG.find_pipeline("accy.kernel.device_scan")
PASS = CATALOG.registry.find("accy.kernel.scan.single_pass", 1, ArtifactFormat.CUDA_CPP)
assert PASS is not None


class ScanRig:
    """scan.cu's module and device_scan's buffers for ``n`` elements on ``rig``'s context."""

    def __init__(self, rig: Rig, n: int) -> None:
        d, self.rig, self.n = rig.d, rig, n
        with tempfile.TemporaryDirectory() as cache:
            image = CompileCache(cache).compile(SOURCE.read_text(), arch=rig.arch, name=SOURCE.name)
        data = image.data + b"\0" if image.kind == "ptx" else image.data
        self.module = check(d.cuModuleLoadData(data), "cuModuleLoadData")
        self.tiles = m = -(-n // TILE)
        self.x_host = np.random.default_rng(1).random(n, dtype=np.float32)
        self.x, self.y = self._alloc(n), self._alloc(n)
        self.sums, self.offsets = self._alloc(self.tiles), self._alloc(self.tiles)
        # the single pass's state and partials, sized and zeroed as the pipeline's manifest
        # says (the one place its tile is read)
        self.state, self.partials = self._scratch(n)
        check(d.cuMemcpyHtoD(self.x, self.x_host.data, n * 4), "cuMemcpyHtoD")
        self._keep: list[Any] = []
        self.ways = {
            "scan": [
                self._stage(
                    "accy_scan_single_pass",
                    self._passes(n),
                    TILE_THREADS,
                    self.y,
                    self.state,
                    self.partials,
                    self.x,
                    n,
                )
            ],
            "scan3": [
                self._stage("accy_scan_tile_sum", self.tiles, TILE_THREADS, self.sums, self.x, n),
                self._stage(
                    "accy_scan_tile_offsets", 1, OFFSETS_THREADS, self.offsets, self.sums, m
                ),
                self._stage(
                    "accy_scan_tile_scan", self.tiles, TILE_THREADS, self.y, self.x, self.offsets, n
                ),
            ],
        }

    def _alloc(self, count: int, size: int = 4) -> int:
        return int(check(self.rig.d.cuMemAlloc(count * size), "cuMemAlloc"))

    def _scratch(self, n: int) -> list[int]:
        addresses = []
        for spec in SCAN.intermediates:
            size = spec.byte_size([Scalar.u32(n)])
            addresses.append(self._alloc(size, 1))
            if spec.zeroed:
                check(self.rig.d.cuMemsetD8(addresses[-1], 0, size), "cuMemsetD8")
        return addresses

    @staticmethod
    def _passes(n: int) -> int:
        """The single pass's grid for ``n``, by its kernel's launch rule."""
        return PASS.launch.resolve([Scalar.u32(n)]).grid[0]

    def _stage(self, entry: str, grid: int, block: int, *args: int) -> tuple[Any, ...]:
        """One kernel: its function, shape and arguments (pointers, then one u32 last)."""
        function = check(self.rig.d.cuModuleGetFunction(self.module, entry.encode()), entry)
        values = [ctypes.c_uint64(a) for a in args[:-1]] + [ctypes.c_uint32(args[-1])]
        return function, grid, block, values

    def launcher(self, stream: Any, way: str = "scan") -> Callable[[], None]:
        """``way``'s kernels on ``stream``, not waited for."""
        rig = self.rig
        kernels = [rig.kernel(f, grid, block, stream, v) for f, grid, block, v in self.ways[way]]

        def go() -> None:
            for kernel in kernels:
                kernel()

        return go

    def graph_launcher(
        self, stream: Any, launch: Callable[[], None] | None = None
    ) -> Callable[[], None]:
        """``launch`` (device_scan's kernel unless given) captured once into a graph; a launch
        of it on ``stream``."""
        d = self.rig.d
        mode = d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check(d.cuStreamBeginCapture(stream, mode), "cuStreamBeginCapture")
        (launch or self.launcher(stream))()
        graph = check(d.cuStreamEndCapture(stream), "cuStreamEndCapture")
        exec_ = check(d.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        self._keep += [graph, exec_]
        graph_launch = d.cuGraphLaunch

        def go() -> None:
            result = graph_launch(exec_, stream)
            if result[0]:
                check(result, "cuGraphLaunch")

        return go

    def error(self) -> float:
        """y's relative L2 error against numpy's float64 cumulative sum; y is then poisoned."""
        d = self.rig.d
        check(d.cuCtxSynchronize(), "cuCtxSynchronize")
        y = np.empty(self.n, dtype=np.float32)
        check(d.cuMemcpyDtoH(y.data, self.y, self.n * 4), "cuMemcpyDtoH")
        check(d.cuMemsetD32(self.y, 0x7FC00000, self.n), "cuMemsetD32")  # NaN
        want = np.cumsum(self.x_host, dtype=np.float64)
        return float(np.linalg.norm(y - want) / np.linalg.norm(want))


def prepare_scan(spec: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """One process: the tiny kernel and its graph, device_scan's kernel and its graph, and
    the three kernels device_scan ran before, each waited; y checked after each scan way."""
    rig = Rig()
    scan = ScanRig(rig, int(spec["n"]))
    stream = rig.stream()
    sync = rig.synchronizer(stream)
    iterations, tiny = int(spec["iterations"]), int(spec["tiny_iters"])
    ways = {
        "tiny": rig.launcher(tiny, stream),
        "tiny_graph": scan.graph_launcher(stream, rig.launcher(tiny, stream)),
        "scan": scan.launcher(stream),
        "scan_graph": scan.graph_launcher(stream),
        "scan3": scan.launcher(stream, "scan3"),
    }

    def run() -> dict[str, Any]:
        found: dict[str, Any] = {}
        errors: dict[str, float] = {}
        for name, launch in ways.items():

            def waited(launch: Callable[[], None] = launch) -> None:
                launch()
                sync()

            found[name] = _percentiles(_timed(waited, iterations, warmup=200))
            if not name.startswith("tiny"):
                errors[name] = scan.error()
                if not errors[name] < 1e-5:
                    raise RuntimeError(f"device_scan's {name}: relative error {errors[name]}")
        return found | {"device": rig.name, "n": scan.n, "rel_err": errors}

    return run
