"""Can the daemon build the device-side scheduler (docs/device-launch.md) with what it ships,
without nvcc? NVRTC compiles relocatable device code that calls the device runtime
(``cudaGraphLaunch`` in a kernel), the driver's linker links it with ``libcudadevrt.a`` (which
``cuda.pathfinder`` finds in the CUDA runtime's wheel, or a toolkit), and a graph launched from
the device runs and counts a word. Then whether a graph launched from the device keeps an SM
partition (a green context, as a tenant's): a kernel of 264 blocks records the SM each block
ran on, launched from the host outside and inside a 16-SM partition, and from the device with
its graph captured inside the partition or with the launching graph there. Prints one JSON
line; exits 1 where a step fails.

    python bench/device_sched_toolchain.py
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))

from accyd.backends.cuda.compile_cache import cuda_include_dirs
from accyd.backends.cuda.devrt import find_devrt, link_devrt

SOURCE = r"""
#include <cuda_runtime.h>
extern "C" __global__ void mark(unsigned int *word) { atomicAdd(word, 1u); }
extern "C" __global__ void launcher(cudaGraphExec_t child, unsigned int *errors) {
    cudaError_t error = cudaGraphLaunch(child, cudaStreamGraphFireAndForget);
    if (error != cudaSuccess) { atomicAdd(errors, 1u); errors[1] = (unsigned int)error; }
}
extern "C" __global__ void where(unsigned int *sms) {
    if (threadIdx.x != 0) return;
    unsigned int sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    sms[blockIdx.x] = sm;
    long long until = clock64() + 40000; /* about 20 us: the blocks spread over the SMs */
    while (clock64() < until) {}
}
"""
BLOCKS = 264
"""Blocks of ``where``: two per SM of an H100 or H200."""
PARTITION_SMS = 16


class StepFailed(Exception):
    """One step of the check failed; the message names it."""


def call(result: Any, what: str) -> Any:
    """The values of a cuda.bindings call after its status; StepFailed where it failed."""
    status, *values = result
    if int(status) != 0:
        raise StepFailed(f"{what}: {status!r}")
    return values[0] if len(values) == 1 else tuple(values)


def compile_relocatable(arch: str) -> tuple[bytes, str]:
    """SOURCE as relocatable device code for ``arch`` (sm_XY: a cubin), and NVRTC's log."""
    from cuda.bindings import nvrtc

    program = call(nvrtc.nvrtcCreateProgram(SOURCE.encode(), b"sched.cu", 0, [], []), "create")
    options = [b"-rdc=true", f"--gpu-architecture={arch}".encode()]
    options += [b"-I" + folder.encode() for folder in cuda_include_dirs()]
    (status,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
    size = call(nvrtc.nvrtcGetProgramLogSize(program), "log size")
    log = b" " * size
    nvrtc.nvrtcGetProgramLog(program, log)
    if int(status) != 0:
        raise StepFailed(f"NVRTC: {status!r}\n{log.decode(errors='replace')}")
    image = b" " * call(nvrtc.nvrtcGetCUBINSize(program), "cubin size")
    call(nvrtc.nvrtcGetCUBIN(program, image), "cubin")
    nvrtc.nvrtcDestroyProgram(program)
    return image, log.decode(errors="replace").strip("\0 \n")


def launch(cu: Any, stream: Any, function: Any, args: tuple[Any, ...], blocks: int = 1) -> None:
    """``function`` on ``blocks`` blocks, its arguments all pointer-sized: one thread for
    one block (``mark`` and ``launcher`` count and launch once), else 32 a block."""
    types = tuple(ctypes.c_void_p for _ in args)
    threads = 1 if blocks == 1 else 32
    call(
        cu.cuLaunchKernel(function, blocks, 1, 1, threads, 1, 1, 0, stream, (args, types), 0),
        "launch",
    )


def captured(
    cu: Any, stream: Any, function: Any, args: tuple[Any, ...], flags: int, blocks: int = 1
) -> Any:
    """A graph of one launch of ``function``, captured on ``stream`` and instantiated."""
    call(
        cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL),
        "begin capture",
    )
    launch(cu, stream, function, args, blocks)
    graph = call(cu.cuStreamEndCapture(stream), "end capture")
    return call(cu.cuGraphInstantiate(graph, flags), "instantiate")


def sms_used(cu: Any, sms: Any, stream: Any) -> int:
    """How many SMs the last ``where`` ran on (after ``stream`` finished)."""
    call(cu.cuStreamSynchronize(stream), "synchronize")
    seen = (ctypes.c_uint32 * BLOCKS)()
    call(cu.cuMemcpyDtoH(seen, sms, 4 * BLOCKS), "cuMemcpyDtoH")
    return len(set(seen) - {0xFFFFFFFF})


def partition_kept(cu: Any, module: Any, device: Any, driver: int, plain: Any) -> dict[str, Any]:
    """SMs ``where``'s blocks ran on: from the host outside and inside a partition, and from
    the device with the child captured in it or the launching graph in it."""
    from accyd.backends.cuda.driver import check
    from accyd.backends.cuda.partitions import GreenContexts
    from accyd.backends.partitions import PartitionSpec

    where = call(cu.cuModuleGetFunction(module, b"where"), "where")
    launcher = call(cu.cuModuleGetFunction(module, b"launcher"), "launcher")
    greens = GreenContexts()
    split = greens.make(cu, check, device, driver, [PartitionSpec("p", sms=PARTITION_SMS)])
    if split.unconfined:
        return {"partition": f"not made: {split.unconfined}"}
    green = greens.stream(cu, check, "p", 0)
    sms = call(cu.cuMemAlloc(4 * BLOCKS), "cuMemAlloc")
    errors = call(cu.cuMemAlloc(8), "cuMemAlloc")  # how many, and the last one's code
    device_launch = int(cu.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH)
    found: dict[str, Any] = {"partition_sms": PARTITION_SMS}
    launch(cu, plain, where, (int(sms),), BLOCKS)
    found["host_launch_outside"] = sms_used(cu, sms, plain)
    launch(cu, green, where, (int(sms),), BLOCKS)
    found["host_launch_in_partition"] = sms_used(cu, sms, green)
    for name, child_on, parent_on in (
        ("device_launch_outside", plain, plain),
        ("device_launch_child_captured_in_partition", green, plain),
        ("device_launch_from_a_graph_in_partition", plain, green),
    ):
        call(cu.cuMemsetD32(sms, 0xFFFFFFFF, BLOCKS), "cuMemsetD32")  # no SM, until it runs
        call(cu.cuMemsetD32(errors, 0, 2), "cuMemsetD32")
        try:
            child = captured(cu, child_on, where, (int(sms),), device_launch, BLOCKS)
            call(cu.cuGraphUpload(child, child_on), "cuGraphUpload")
            call(cu.cuStreamSynchronize(child_on), "synchronize")
            parent = captured(cu, parent_on, launcher, (int(child), int(errors)), 0)
            call(cu.cuGraphLaunch(parent, parent_on), "cuGraphLaunch(parent)")
            used = sms_used(cu, sms, parent_on)
            failed = (ctypes.c_uint32 * 2)()
            call(cu.cuMemcpyDtoH(failed, errors, 8), "cuMemcpyDtoH")
            found[name] = {"sms": used, "launch_errors": failed[0], "last_error": failed[1]}
        except StepFailed as error:  # say which way failed, and try the other
            found[name] = f"failed: {error}"
    return found


def main() -> int:
    from cuda.bindings import driver as cu
    from cuda.bindings import nvrtc

    found: dict[str, Any] = {"nvrtc": call(nvrtc.nvrtcVersion(), "nvrtcVersion")}
    try:
        devrt = find_devrt()
        found["libcudadevrt"] = devrt
        call(cu.cuInit(0), "cuInit")
        found["driver"] = call(cu.cuDriverGetVersion(), "cuDriverGetVersion")
        device = call(cu.cuDeviceGet(0), "cuDeviceGet")
        attribute = cu.CUdevice_attribute
        major = call(
            cu.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device),
            "major",
        )
        minor = call(
            cu.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device),
            "minor",
        )
        context = call(cu.cuDevicePrimaryCtxRetain(device), "retain")
        call(cu.cuCtxSetCurrent(context), "set current")
        image, found["nvrtc_log"] = compile_relocatable(f"sm_{major}{minor}")
        linked = link_devrt(cu, call, image, "cubin", devrt)
        found["relocatable_bytes"], found["linked_bytes"] = len(image), len(linked)
        module = call(cu.cuModuleLoadData(linked), "cuModuleLoadData")
        mark = call(cu.cuModuleGetFunction(module, b"mark"), "mark")
        launcher = call(cu.cuModuleGetFunction(module, b"launcher"), "launcher")
        words = call(cu.cuMemAlloc(12), "cuMemAlloc")  # mark's count, launcher's errors
        call(cu.cuMemsetD32(words, 0, 3), "cuMemsetD32")
        stream = call(cu.cuStreamCreate(1), "cuStreamCreate")
        device_launch = cu.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH
        child = captured(cu, stream, mark, (int(words),), int(device_launch))
        call(cu.cuGraphUpload(child, stream), "cuGraphUpload")
        parent = captured(cu, stream, launcher, (int(child), int(words) + 4), 0)
        call(cu.cuGraphLaunch(parent, stream), "cuGraphLaunch(parent)")
        call(cu.cuStreamSynchronize(stream), "synchronize")
        counted = (ctypes.c_uint32 * 2)()
        call(cu.cuMemcpyDtoH(counted, words, 8), "cuMemcpyDtoH")
        found["child_ran"], found["device_launch_errors"] = counted[0], counted[1]
        found["ok"] = counted[0] == 1 and counted[1] == 0
        found.update(partition_kept(cu, module, device, int(found["driver"]), stream))
    except Exception as error:  # any step (StepFailed names it): say which, and fail
        found["ok"] = False
        found["error"] = f"{type(error).__name__}: {error}"
    print(json.dumps(found, default=str))
    return 0 if found["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
