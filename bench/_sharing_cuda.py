"""The sharing benchmark's baselines: the fma kernel launched raw through cuda.bindings, and MPS.

Everything here runs in worker processes (the parent never opens a context), on
device 0's primary context, with the kernel of bench/catalog/fma.cu compiled by
NVRTC with the daemon's own options and launched with pre-packed arguments.
Every driver call's result is checked.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from _sharing_kernel import BLOCK, COUNT, GRID, SYNC_EVERY, max_error
from bench_core_cuda import Timer
from bench_service import _percentiles, _timed

from accyd.backends.cuda.compile_cache import CompileCache
from accyd.backends.cuda.driver import check, cuda_driver

SOURCE = Path(__file__).with_name("catalog") / "fma.cu"
ENTRY = "accy_bench_fma"


class Rig:
    """Device 0's primary context, the fma module, x and y of 1024 float32, launchers."""

    def __init__(self, image_path: Path | None = None) -> None:
        d = self.d = cuda_driver()
        check(d.cuInit(0), "cuInit")
        self.device = check(d.cuDeviceGet(0), "cuDeviceGet")
        raw_name = check(d.cuDeviceGetName(256, self.device), "cuDeviceGetName")
        self.name = bytes(raw_name).split(b"\0", 1)[0].decode(errors="replace").strip()
        self.context = check(d.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
        check(d.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        attribute = d.CUdevice_attribute
        major, minor = (
            int(check(d.cuDeviceGetAttribute(a, self.device), "cuDeviceGetAttribute"))
            for a in (
                attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
            )
        )
        self.arch = (major, minor)
        if image_path is None:
            with tempfile.TemporaryDirectory() as cache:
                image = CompileCache(cache).compile(
                    SOURCE.read_text(), arch=self.arch, name=SOURCE.name
                )
            self.image = image.data + b"\0" if image.kind == "ptx" else image.data
        else:
            self.image = image_path.read_bytes()
        self.module = check(d.cuModuleLoadData(self.image), "cuModuleLoadData")
        self.function = check(d.cuModuleGetFunction(self.module, ENTRY.encode()), "GetFunction")
        self.x_host = np.random.default_rng(0).random(COUNT, dtype=np.float32)
        self.x = int(check(d.cuMemAlloc(COUNT * 4), "cuMemAlloc"))
        self.y = int(check(d.cuMemAlloc(COUNT * 4), "cuMemAlloc"))
        check(d.cuMemcpyHtoD(self.x, self.x_host.data, COUNT * 4), "cuMemcpyHtoD")
        self._keep: list[Any] = []

    def stream(self) -> Any:
        flags = self.d.CUstream_flags.CU_STREAM_NON_BLOCKING
        return check(self.d.cuStreamCreate(flags), "cuStreamCreate")

    def launcher(
        self, iters: int, stream: Any, entry: str = ENTRY, grid: int = GRID
    ) -> Callable[[], None]:
        """A launch of fma.cu's ``entry`` (its fma kernel, or another with its parameters)
        on ``stream`` with pre-packed arguments (y, x, iters), ``grid`` blocks of BLOCK."""
        function = self.function
        if entry != ENTRY:
            function = check(self.d.cuModuleGetFunction(self.module, entry.encode()), entry)
        # u32 iters: the low half of its 8 bytes, little-endian
        args = [ctypes.c_uint64(self.y), ctypes.c_uint64(self.x), ctypes.c_uint64(iters)]
        return self.kernel(function, grid, BLOCK, stream, args)

    def kernel(
        self, function: Any, grid: int, block: int, stream: Any, args: list[Any]
    ) -> Callable[[], None]:
        """A launch of ``function`` on ``stream``, ``grid`` blocks of ``block``, with ``args``
        (ctypes values, kept alive here) packed once; its result checked."""
        params = (ctypes.c_void_p * len(args))(*(ctypes.addressof(a) for a in args))
        self._keep += [args, params]
        launch, pointer = self.d.cuLaunchKernel, ctypes.addressof(params)

        def go() -> None:
            result = launch(function, grid, 1, 1, block, 1, 1, 0, stream, pointer, 0)
            if result[0]:
                check(result, "cuLaunchKernel")

        return go

    def synchronizer(self, stream: Any) -> Callable[[], None]:
        synchronize = self.d.cuStreamSynchronize

        def sync() -> None:
            result = synchronize(stream)
            if result[0]:
                check(result, "cuStreamSynchronize")

        return sync

    def read_y(self) -> np.ndarray[Any, np.dtype[np.float32]]:
        check(self.d.cuCtxSynchronize(), "cuCtxSynchronize")
        y = np.empty(COUNT, dtype=np.float32)
        check(self.d.cuMemcpyDtoH(y.data, self.y, COUNT * 4), "cuMemcpyDtoH")
        return y

    def check_result(self, iters: int) -> float:
        """Largest difference of y from the host's computation; raises past the tolerance."""
        return max_error(self.read_y(), self.x_host, iters)


def kernels_per_second(
    launches: Sequence[Callable[[], None]],
    syncs: Sequence[Callable[[], None]],
    seconds: float,
    every: int = SYNC_EVERY,
) -> dict[str, float]:
    """Round-robin over the streams' launchers; each stream synchronized every ``every``
    launches (1: each launch waited for, as an inference client's loop waits)."""
    for _ in range(every):  # warm
        for launch in launches:
            launch()
    for sync in syncs:
        sync()
    count, started = 0, time.perf_counter()
    end = started + seconds
    while time.perf_counter() < end:
        for _ in range(every):
            for launch in launches:
                launch()
        for sync in syncs:
            sync()
        count += every * len(launches)
    elapsed = time.perf_counter() - started
    return {"kernels": count, "seconds": elapsed, "per_second": count / elapsed}


def kernel_us(rig: Rig, stream: Any, iters: int, reps: int = 200) -> float:
    """Median device time of one kernel (CUDA events between back-to-back launches), µs."""
    times = Timer(stream).run(rig.launcher(iters, stream), reps, warmup=20)
    return statistics.median(times) * 1e3


def calibrate(rig: Rig, stream: Any, target_us: float) -> tuple[int, float]:
    """``iters`` for a kernel of about ``target_us``: a line through two sizes, refined twice."""
    low, high = 1000, 8000
    t_low, t_high = kernel_us(rig, stream, low), kernel_us(rig, stream, high)
    slope = max((t_high - t_low) / (high - low), 1e-6)
    base = t_low - slope * low
    iters = low
    for _ in range(3):
        iters = int(min(1_000_000, max(1, round((target_us - base) / slope))))
        measured = kernel_us(rig, stream, iters)
        if abs(measured - target_us) < 0.02 * target_us:
            return iters, measured
        base = measured - slope * iters  # keep the slope, move the line through this point
    return iters, measured


# -- worker bodies (kinds "cuda-inproc" and "cuda-rate") ----------------------------------


def prepare_inproc(spec: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """One process: compile, calibrate, then the single-process series (1 and 8 streams)."""
    rig = Rig()
    Path(spec["image_path"]).write_bytes(rig.image)
    seconds, iterations = float(spec["seconds"]), int(spec["iterations"])

    def run() -> dict[str, Any]:
        stream = rig.stream()
        tiny = int(spec["tiny_iters"])
        kernels: dict[str, dict[str, Any]] = {
            "tiny": {"iters": tiny, "us": kernel_us(rig, stream, tiny)}
        }
        print(f"kernel tiny: iters={tiny}, {kernels['tiny']['us']:.2f} µs", flush=True)
        for name, target in spec["targets_us"].items():
            iters, measured = calibrate(rig, stream, float(target))
            kernels[name] = {"iters": iters, "us": measured, "target_us": target}
            print(f"kernel {name}: iters={iters}, {measured:.2f} µs", flush=True)
        launch, sync = rig.launcher(tiny, stream), rig.synchronizer(stream)

        def round_trip() -> None:
            launch()
            sync()

        rtt = _percentiles(_timed(round_trip, iterations, warmup=200))
        streams = [rig.stream() for _ in range(8)]
        one: dict[str, Any] = {}
        eight: dict[str, Any] = {}
        for name in spec["targets_us"]:
            iters = kernels[name]["iters"]
            one[name] = kernels_per_second([rig.launcher(iters, stream)], [sync], seconds)
            eight[name] = kernels_per_second(
                [rig.launcher(iters, s) for s in streams],
                [rig.synchronizer(s) for s in streams],
                seconds,
            )
        error = rig.check_result(kernels["long"]["iters"])
        return {
            "device": rig.name,
            "kernels": kernels,
            "round_trip": rtt,
            "one_stream": one,
            "eight_streams": eight,
            "max_error": error,
        }

    return run


def prepare_rate(spec: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """One of N processes, each its own context (or an MPS client): kernels/s on one stream."""
    rig = Rig(Path(spec["image_path"]))
    stream = rig.stream()
    iters = int(spec["iters"])
    launch, sync = rig.launcher(iters, stream), rig.synchronizer(stream)
    for _ in range(4):
        launch()
    sync()

    def run() -> dict[str, Any]:
        every = int(spec.get("sync_every", SYNC_EVERY))
        found = kernels_per_second([launch], [sync], float(spec["seconds"]), every)
        rig.check_result(iters)
        return found

    return run


# -- MPS ------------------------------------------------------------------------------------


class MpsUnavailable(RuntimeError):
    """MPS could not be started here; the reason is the message."""


@contextlib.contextmanager
def mps_server(timeout: float = 20.0) -> Iterator[dict[str, str]]:
    """An MPS control daemon on private pipe and log folders; yields its clients' variables.

    Started in the foreground (``-f``: like ``-d``, but a child this process can
    wait for); always asked to ``quit`` and waited for on the way out, killed if
    it does not exit in time.
    """
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        raise MpsUnavailable("nvidia-cuda-mps-control is not on PATH")
    folder = Path(tempfile.mkdtemp(prefix="accy-mps-"))
    variables = {
        "CUDA_MPS_PIPE_DIRECTORY": str(folder / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(folder / "log"),
    }
    for path in variables.values():
        os.makedirs(path)
    env = dict(os.environ) | variables
    output = folder / "control.out"
    with output.open("wb") as sink:
        process = subprocess.Popen([control, "-f"], env=env, stdout=sink, stderr=sink)
    try:
        deadline = time.monotonic() + timeout
        while not (folder / "pipe" / "control").exists():
            if process.poll() is not None:
                said = output.read_text(errors="replace")[-500:].strip() or "(no output)"
                raise MpsUnavailable(f"it exited with {process.returncode}: {said}")
            if time.monotonic() > deadline:
                raise MpsUnavailable(f"no control pipe after {timeout} s")
            time.sleep(0.05)
        yield variables
    finally:
        try:
            if process.poll() is None:
                subprocess.run(
                    [control], input="quit\n", env=env, text=True, capture_output=True, timeout=30
                )
                process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)


def mps_log_tail(variables: dict[str, str]) -> str:
    """The end of the control daemon's log (how many clients it saw, errors)."""
    with contextlib.suppress(OSError):
        return (Path(variables["CUDA_MPS_LOG_DIRECTORY"]) / "control.log").read_text()[-600:]
    return ""
