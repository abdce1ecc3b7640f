"""The CUDA backend itself: memory, copies, streams, events, compile cache, errors, faults."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from accyd.backends.base import ArtifactRequest, DeviceBuffer, LaunchRequest, LoadedKernel, Stream
from accyd.backends.cuda import cuda_available
from accyd.backends.cuda.backend import CudaBackend
from accyd.catalog.dtypes import DType, Scalar
from accyd.catalog.model import ArtifactFormat, FixedGeometry
from accyd.errors import (
    FailedPrecondition,
    InvalidArtifact,
    LaunchArgumentMismatch,
    LaunchFailed,
    OutOfMemory,
    Unavailable,
    UnsupportedOperation,
)

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not cuda_available(), reason="no CUDA driver or device here"),
]

REPO = Path(__file__).resolve().parents[2]

TEST_SOURCE = r"""
extern "C" __global__ void accy_test_fill(float* out, unsigned int n, float value) {
    const unsigned long long i = blockIdx.x * 256ull + threadIdx.x;
    if (i < n) out[i] = value;
}

extern "C" __global__ void accy_test_add_one(float* out, const float* in, unsigned int n) {
    const unsigned long long i = blockIdx.x * 256ull + threadIdx.x;
    if (i < n) out[i] = in[i] + 1.0f;
}

// Spins for about `cycles` clock cycles, then writes value to out[0..n).
extern "C" __global__ void accy_test_spin_fill(float* out, unsigned int n, float value,
                                               unsigned long long cycles) {
    const long long start = clock64();
    while (static_cast<unsigned long long>(clock64() - start) < cycles) {
    }
    const unsigned long long i = blockIdx.x * 256ull + threadIdx.x;
    if (i < n) out[i] = value;
}

// Every scalar type, written back as doubles: out[0..6).
extern "C" __global__ void accy_test_scalars(double* out, unsigned int a, int b, float c,
                                             unsigned long long d, long long e, double f) {
    out[0] = a; out[1] = b; out[2] = c; out[3] = (double)d; out[4] = (double)e; out[5] = f;
}

// Uses `dynamic` bytes of dynamic shared memory: out[i] = i through shared memory.
extern "C" __global__ void accy_test_dynamic_shared(float* out, unsigned int count) {
    extern __shared__ float scratch[];
    for (unsigned i = threadIdx.x; i < count; i += blockDim.x) scratch[i] = static_cast<float>(i);
    __syncthreads();
    for (unsigned i = threadIdx.x; i < count; i += blockDim.x) out[i] = scratch[count - 1 - i];
}
"""

KERNELS = {
    "accy_test_fill": (1, 2),
    "accy_test_add_one": (2, 1),
    "accy_test_spin_fill": (1, 3),
    "accy_test_scalars": (1, 6),
    "accy_test_dynamic_shared": (1, 1),
}

PTX_FILL = r"""
.version 7.8
.target sm_80
.address_size 64

.visible .entry accy_ptx_fill(
    .param .u64 accy_ptx_fill_param_0,
    .param .u32 accy_ptx_fill_param_1,
    .param .f32 accy_ptx_fill_param_2
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .f32 %f<2>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [accy_ptx_fill_param_0];
    ld.param.u32 %r1, [accy_ptx_fill_param_1];
    ld.param.f32 %f1, [accy_ptx_fill_param_2];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd4, %rd2, %rd3;
    st.global.f32 [%rd4], %f1;
DONE:
    ret;
}
"""


def request(
    name: str,
    source: str = TEST_SOURCE,
    fmt: ArtifactFormat = ArtifactFormat.CUDA_CPP,
    counts: tuple[int, int] | None = None,
) -> ArtifactRequest:
    buffers, scalars = counts if counts is not None else KERNELS[name]
    return ArtifactRequest(
        kernel_name=name,
        format=fmt,
        argument_count=buffers + scalars,
        scalar_argument_count=scalars,
        payload=source,
        origin="test_cuda.cu",
    )


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CudaBackend]:
    be = CudaBackend(0, cache_dir=tmp_path_factory.mktemp("kernel-cache"))
    yield be
    be.close()


@pytest.fixture(scope="module")
def kernels(backend: CudaBackend) -> dict[str, LoadedKernel]:
    loaded = {}
    for name in KERNELS:
        artifact = backend.create_artifact(request(name))
        loaded[name] = backend.load_artifact(artifact)
        artifact.close()
    return loaded


def f32(buffer_values: np.ndarray) -> bytes:
    return np.ascontiguousarray(buffer_values, dtype=np.float32).tobytes()


def launch(
    be: CudaBackend,
    kernel: LoadedKernel,
    buffers: list[DeviceBuffer],
    scalars: list[Scalar],
    grid: tuple[int, int, int],
    block: tuple[int, int, int] = (256, 1, 1),
    stream: Stream | None = None,
    shared: int = 0,
) -> None:
    be.launch(
        LaunchRequest(None, kernel, buffers, scalars, FixedGeometry(grid, block), stream, shared)
    )


def fill(
    be: CudaBackend,
    kernels: dict[str, LoadedKernel],
    buf: DeviceBuffer,
    n: int,
    value: float,
    stream: Stream | None = None,
) -> None:
    launch(
        be,
        kernels["accy_test_fill"],
        [buf],
        [Scalar.u32(n), Scalar.f32(value)],
        ((n + 255) // 256, 1, 1),
        stream=stream,
    )


def read_f32(
    be: CudaBackend, buf: DeviceBuffer, n: int, stream: Stream | None = None
) -> np.ndarray:
    return np.frombuffer(be.read(buf, 0, n * 4, stream), dtype=np.float32)


# -- memory --------------------------------------------------------------------------------


def test_identity(backend: CudaBackend) -> None:
    from accyd.backends.base import Backend, BackendKind

    assert isinstance(backend, Backend)
    assert backend.kind is BackendKind.CUDA
    assert ArtifactFormat.CUDA_CPP in backend.formats
    assert backend.device_name
    assert backend.compute_capability >= (7, 0)


@pytest.mark.parametrize("size", [1, 3, 255, 256, 257, 4096, 1 << 20, (1 << 20) + 1])
def test_allocations_are_256_byte_aligned(backend: CudaBackend, size: int) -> None:
    base = backend.memory_in_use()
    bufs = [backend.allocate_buffer(size) for _ in range(4)]
    assert all(b.address % 256 == 0 and b.byte_size == size for b in bufs)
    assert len({b.id for b in bufs}) == 4
    assert backend.memory_in_use() == base + 4 * size
    for b in bufs:
        backend.destroy(b)
    assert backend.memory_in_use() == base


def test_larger_alignment_and_bad_sizes(backend: CudaBackend) -> None:
    buf = backend.allocate_buffer(1000, alignment=65536)
    assert buf.address % 65536 == 0
    backend.destroy(buf)
    with pytest.raises(LaunchArgumentMismatch):
        backend.allocate_buffer(0)
    with pytest.raises(LaunchArgumentMismatch):
        backend.allocate_buffer(64, alignment=384)


def test_destroy_frees_device_memory_and_is_idempotent(backend: CudaBackend) -> None:
    free_before, total = backend.device_memory_info()
    assert 0 < free_before <= total
    buf = backend.allocate_buffer(1 << 30)
    free_during, _ = backend.device_memory_info()
    assert free_during <= free_before - (1 << 30) + (64 << 20)
    backend.destroy(buf)
    backend.destroy(buf)
    free_after, _ = backend.device_memory_info()
    assert free_after >= free_before - (64 << 20)


def test_out_of_memory_fails_one_call_only(
    backend: CudaBackend, kernels: dict[str, LoadedKernel]
) -> None:
    base = backend.memory_in_use()
    with pytest.raises(OutOfMemory):
        backend.allocate_buffer(1 << 50)
    assert backend.memory_in_use() == base
    buf = backend.allocate_buffer(4 * 1000)
    fill(backend, kernels, buf, 1000, 2.5)
    assert np.all(read_f32(backend, buf, 1000) == 2.5)
    backend.destroy(buf)


def test_close_frees_everything_and_is_idempotent(tmp_path: Path) -> None:
    be = CudaBackend(0, cache_dir=tmp_path)
    free_before, _ = be.device_memory_info()
    bufs = [be.allocate_buffer(64 << 20) for _ in range(4)]
    art = be.create_artifact(request("accy_test_fill"))
    kernel = be.load_artifact(art)
    stream = be.create_stream()
    fill(be, {"accy_test_fill": kernel}, bufs[0], 1000, 1.0, stream)
    be.record_event(stream)
    assert be.memory_in_use() == 4 * (64 << 20)
    be.close()
    be.close()
    assert be.memory_in_use() == 0
    with pytest.raises(Unavailable):
        be.allocate_buffer(16)
    be.destroy(bufs[0])  # after close: nothing to do, no error
    other = CudaBackend(0, cache_dir=tmp_path)
    try:
        free_after, _ = other.device_memory_info()
        assert free_after >= free_before - (64 << 20)
    finally:
        other.close()


# -- copies ----------------------------------------------------------------------------------


def test_write_read_round_trip(backend: CudaBackend) -> None:
    rng = np.random.default_rng()
    data = rng.integers(0, 256, size=10_000, dtype=np.uint8).tobytes()
    buf = backend.allocate_buffer(len(data))
    backend.write(buf, 0, data, None)
    assert backend.read(buf, 0, len(data), None) == data
    backend.write(buf, 17, memoryview(b"abcdef"), None)
    assert backend.read(buf, 15, 10, None) == data[15:17] + b"abcdef" + data[23:25]
    out = np.empty(100, dtype=np.uint8)
    backend.read_into(buf, 1000, out, None)
    assert out.tobytes() == data[1000:1100]
    staging = bytearray(64)  # the service's staging chunk: a slice of a bytearray
    backend.read_into(buf, 2000, memoryview(staging)[8:40], None)
    assert staging == bytes(8) + data[2000:2032] + bytes(24)
    strided = np.arange(20, dtype=np.uint8)[::2]
    backend.write(buf, 0, memoryview(strided), None)
    assert backend.read(buf, 0, 10, None) == strided.tobytes()
    assert backend.read(buf, 0, 0, None) == b""
    backend.destroy(buf)


@pytest.mark.parametrize(("offset", "size"), [(0, 101), (100, 1), (-1, 4), (50, 51)])
def test_copies_are_bounds_checked(backend: CudaBackend, offset: int, size: int) -> None:
    buf = backend.allocate_buffer(100)
    try:
        with pytest.raises(LaunchArgumentMismatch):
            backend.write(buf, offset, b"\0" * max(size, 0), None)
        with pytest.raises(LaunchArgumentMismatch):
            backend.read(buf, offset, size, None)
    finally:
        backend.destroy(buf)


def test_freed_buffer_is_refused(backend: CudaBackend, kernels: dict[str, LoadedKernel]) -> None:
    buf = backend.allocate_buffer(1024)
    backend.destroy(buf)
    with pytest.raises(LaunchArgumentMismatch):
        backend.read(buf, 0, 4, None)
    with pytest.raises(LaunchArgumentMismatch):
        fill(backend, kernels, buf, 256, 1.0)


# -- launches --------------------------------------------------------------------------------


def test_scalar_packing_every_dtype(backend: CudaBackend, kernels: dict[str, LoadedKernel]) -> None:
    out = backend.allocate_buffer(6 * 8)
    scalars = [
        Scalar(DType.U32, 4_000_000_000),
        Scalar(DType.I32, -123_456),
        Scalar(DType.F32, 1.5),
        Scalar(DType.U64, 2**63 + 5),
        Scalar(DType.I64, -(2**40)),
        Scalar(DType.F64, -0.1),
    ]
    launch(backend, kernels["accy_test_scalars"], [out], scalars, (1, 1, 1), (1, 1, 1))
    got = np.frombuffer(backend.read(out, 0, 48, None), dtype=np.float64)
    assert got.tolist() == [4_000_000_000, -123_456, 1.5, float(2**63 + 5), float(-(2**40)), -0.1]
    backend.destroy(out)


def test_bad_launch_fails_and_backend_keeps_working(
    backend: CudaBackend, kernels: dict[str, LoadedKernel]
) -> None:
    buf = backend.allocate_buffer(4 * 4096)
    with pytest.raises(LaunchFailed) as info:
        launch(
            backend,
            kernels["accy_test_fill"],
            [buf],
            [Scalar.u32(4096), Scalar.f32(1.0)],
            (2, 1, 1),
            (2048, 1, 1),
        )
    assert "accy_test_fill" in str(info.value) and "2048" in str(info.value)
    with pytest.raises(LaunchArgumentMismatch):  # wrong argument count
        launch(backend, kernels["accy_test_fill"], [buf], [Scalar.u32(4096)], (16, 1, 1))
    fill(backend, kernels, buf, 4096, 7.0)
    assert np.all(read_f32(backend, buf, 4096) == 7.0)
    backend.destroy(buf)


def test_dynamic_shared_memory_over_48k(
    backend: CudaBackend, kernels: dict[str, LoadedKernel]
) -> None:
    count = 24 * 1024  # 96 KiB of floats
    buf = backend.allocate_buffer(count * 4)
    launch(
        backend,
        kernels["accy_test_dynamic_shared"],
        [buf],
        [Scalar.u32(count)],
        (1, 1, 1),
        (1024, 1, 1),
        shared=count * 4,
    )
    got = read_f32(backend, buf, count)
    assert np.array_equal(got, np.arange(count, dtype=np.float32)[::-1])
    backend.destroy(buf)


def test_ptx_and_cubin_formats(backend: CudaBackend) -> None:
    n = 1000
    buf = backend.allocate_buffer(n * 4)
    ptx = backend.create_artifact(
        request("accy_ptx_fill", PTX_FILL, ArtifactFormat.CUDA_PTX, (1, 2))
    )
    kernel = backend.load_artifact(ptx)
    launch(backend, kernel, [buf], [Scalar.u32(n), Scalar.f32(3.0)], (4, 1, 1))
    assert np.all(read_f32(backend, buf, n) == 3.0)
    backend.destroy(kernel)
    backend.destroy(kernel)
    with pytest.raises(InvalidArtifact):
        launch(backend, kernel, [buf], [Scalar.u32(n), Scalar.f32(3.0)], (4, 1, 1))

    cpp = backend.create_artifact(request("accy_test_fill"))
    cubin = backend.create_artifact(
        ArtifactRequest("accy_test_fill", ArtifactFormat.CUDA_CUBIN, 3, 2, bytes(cpp.image.data))
    )
    kernel = backend.load_artifact(cubin)
    launch(backend, kernel, [buf], [Scalar.u32(n), Scalar.f32(4.0)], (4, 1, 1))
    assert np.all(read_f32(backend, buf, n) == 4.0)
    backend.destroy(kernel)
    backend.destroy(buf)
    with pytest.raises(UnsupportedOperation):
        backend.create_artifact(request("x", "", ArtifactFormat.HOST_PY, (1, 0)))


def test_missing_symbol_is_a_failed_precondition(backend: CudaBackend) -> None:
    # Not UNAVAILABLE, which clients retry: the catalog names a function the module lacks.
    artifact = backend.create_artifact(request("accy_no_such_kernel", counts=(1, 0)))
    with pytest.raises(FailedPrecondition, match="accy_no_such_kernel"):
        backend.load_artifact(artifact)


def test_launch_from_another_thread(backend: CudaBackend, kernels: dict[str, LoadedKernel]) -> None:
    n = 5000
    buf = backend.allocate_buffer(n * 4)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            stream = backend.create_stream()
            fill(backend, kernels, buf, n, 9.0, stream)
            backend.synchronize(stream)
            backend.destroy_stream(stream)
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert not errors
    assert np.all(read_f32(backend, buf, n) == 9.0)
    backend.destroy(buf)


# -- streams and events ------------------------------------------------------------------------


def test_events_order_work_across_streams(
    backend: CudaBackend, kernels: dict[str, LoadedKernel]
) -> None:
    n = 4096
    first = backend.allocate_buffer(n * 4)
    second = backend.allocate_buffer(n * 4)
    s1 = backend.create_stream()
    s2 = backend.create_stream()
    fill(backend, kernels, first, n, 0.0, s1)
    backend.synchronize(s1)
    # About 0.1 s of spinning on s1, then first := 41; s2 waits for it and adds one.
    launch(
        backend,
        kernels["accy_test_spin_fill"],
        [first],
        [Scalar.u32(n), Scalar.f32(41.0), Scalar(DType.U64, 200_000_000)],
        (n // 256, 1, 1),
        stream=s1,
    )
    event = backend.record_event(s1)
    assert backend.event_done(event) is False
    started = time.perf_counter()
    assert backend.wait_event_for(event, 0.002) is False  # polled for 2 ms, still spinning
    assert 0.002 <= time.perf_counter() - started < 0.05
    backend.wait_event(s2, event)
    launch(
        backend,
        kernels["accy_test_add_one"],
        [second, first],
        [Scalar.u32(n)],
        (n // 256, 1, 1),
        stream=s2,
    )
    assert np.all(read_f32(backend, second, n, s2) == 42.0)
    backend.synchronize_event(event)
    assert backend.event_done(event) is True
    assert backend.wait_event_for(event, 0.0) is True
    backend.destroy_event(event)
    backend.destroy_event(event)
    with pytest.raises(LaunchArgumentMismatch):
        backend.event_done(event)
    # Events are recycled: a fresh one behaves as new.
    again = backend.record_event(None)
    backend.synchronize_event(again)
    assert backend.event_done(again)
    backend.destroy_event(again)
    for s in (s1, s2):
        backend.destroy_stream(s)
    with pytest.raises(LaunchArgumentMismatch):
        fill(backend, kernels, first, n, 1.0, s1)
    backend.synchronize()
    backend.destroy(first)
    backend.destroy(second)


def test_stream_order_within_one_stream(
    backend: CudaBackend, kernels: dict[str, LoadedKernel]
) -> None:
    n = 1 << 16
    a = backend.allocate_buffer(n * 4)
    b = backend.allocate_buffer(n * 4)
    s = backend.create_stream()
    launch(
        backend,
        kernels["accy_test_spin_fill"],
        [a],
        [Scalar.u32(n), Scalar.f32(5.0), Scalar(DType.U64, 20_000_000)],
        (n // 256, 1, 1),
        stream=s,
    )
    launch(
        backend, kernels["accy_test_add_one"], [b, a], [Scalar.u32(n)], (n // 256, 1, 1), stream=s
    )
    assert np.all(read_f32(backend, b, n, s) == 6.0)
    backend.destroy_stream(s)
    backend.destroy(a)
    backend.destroy(b)


def test_notify_runs_after_the_streams_work_and_zero_fill(
    backend: CudaBackend, kernels: dict[str, LoadedKernel]
) -> None:
    n = 1 << 16
    a = backend.allocate_buffer(n * 4)
    backend.write(a, 0, f32(np.full(n, 9.0)), None)
    backend.destroy(a)
    zeroed = backend.allocate_buffer(n * 4, zero=True)
    assert not np.any(read_f32(backend, zeroed, n))
    s = backend.create_stream()
    event = backend.record_event(s)
    launch(
        backend,
        kernels["accy_test_spin_fill"],
        [zeroed],
        [Scalar.u32(n), Scalar.f32(5.0), Scalar(DType.U64, 20_000_000)],
        (n // 256, 1, 1),
        stream=s,
    )
    after = backend.record_event(s)
    called = threading.Event()  # the callback may make no CUDA call: it only signals
    backend.notify(s, called.set)
    assert called.wait(10), "the notification never came"
    # The spin kernel runs for milliseconds: a notification before it ended shows here.
    assert backend.event_done(after), "notified before the stream's work had finished"
    assert backend.event_done(event)
    assert np.all(read_f32(backend, zeroed, n, s) == 5.0)
    for e in (event, after):
        backend.destroy_event(e)
    backend.destroy_stream(s)
    backend.destroy(zeroed)


# -- the compile cache -------------------------------------------------------------------------


def test_compile_cache_cold_warm_corrupt_absent(tmp_path: Path) -> None:
    source = TEST_SOURCE + "\n// cache test\n"
    be = CudaBackend(0, cache_dir=tmp_path)
    try:
        stats = be.cache.stats
        cold = be.create_artifact(request("accy_test_fill", source))
        assert (stats.misses, stats.hits) == (1, 0)
        entries = list(tmp_path.glob("*.bin"))
        assert len(entries) == 1 and not list(tmp_path.glob("*.tmp"))
        warm = be.create_artifact(request("accy_test_add_one", source))
        assert (stats.misses, stats.hits) == (1, 1)
        assert warm.image.data == cold.image.data

        # A second backend (a restarted daemon) finds the entry on disk.
        other = CudaBackend(0, cache_dir=tmp_path)
        try:
            other.create_artifact(request("accy_test_fill", source))
            assert (other.cache.stats.misses, other.cache.stats.hits) == (0, 1)
        finally:
            other.close()

        # Corrupted bytes: the digest does not match, so it recompiles.
        blob = bytearray(entries[0].read_bytes())
        blob[-100] ^= 0xFF
        entries[0].write_bytes(bytes(blob))
        again = be.create_artifact(request("accy_test_fill", source))
        assert (stats.misses, stats.corrupt) == (2, 1)
        assert again.image.data == cold.image.data

        # Absent: compiled again.
        entries[0].unlink()
        be.create_artifact(request("accy_test_fill", source))
        assert stats.misses == 3 and entries[0].exists()

        # A well-formed entry whose image the driver refuses: dropped at load, recompiled.
        junk = b"junk, not a module image\n" * 8
        be.cache._write(entries[0].stem, "cubin", junk)
        artifact = be.create_artifact(request("accy_test_fill", source))
        assert artifact.image.data == junk
        kernel = be.load_artifact(artifact)
        assert stats.corrupt == 2 and stats.misses == 4
        buf = be.allocate_buffer(4 * 300)
        fill(be, {"accy_test_fill": kernel}, buf, 300, 6.0)
        assert np.all(read_f32(be, buf, 300) == 6.0)
    finally:
        be.close()


def test_compile_error_names_the_nvrtc_log(backend: CudaBackend) -> None:
    bad = 'extern "C" __global__ void accy_bad(float* x) { x[0] = accy_undefined_name; }'
    with pytest.raises(FailedPrecondition) as info:  # the catalog's to fix: not retryable
        backend.create_artifact(request("accy_bad", bad, counts=(1, 0)))
    message = str(info.value)
    assert "does not compile" in message and "accy_undefined_name" in message
    assert "kernel.cu(1): error" in message  # NVRTC's log names the file and the line


# -- sticky faults (in a child process: a fault poisons the whole process) ----------------------

FAULT_SCRIPT = textwrap.dedent(
    """
    import sys, tempfile
    from accyd.backends.base import ArtifactRequest, LaunchRequest
    from accyd.backends.cuda import CudaBackend
    from accyd.catalog.dtypes import DType, Scalar
    from accyd.catalog.model import ArtifactFormat, FixedGeometry
    from accyd.errors import DeviceFault

    src = ('extern "C" __global__ void accy_wild(unsigned long long p) '
           '{ *(volatile float*)p = 1.0f; }')
    be = CudaBackend(0, cache_dir=tempfile.mkdtemp())
    keep = be.allocate_buffer(1 << 20)
    art = be.create_artifact(ArtifactRequest("accy_wild", ArtifactFormat.CUDA_CPP, 1, 1, src))
    k = be.load_artifact(art)
    be.launch(LaunchRequest(None, k, [], [Scalar(DType.U64, 0x10)],
                            FixedGeometry((1, 1, 1), (1, 1, 1))))
    try:
        be.synchronize()
    except DeviceFault as e:
        print("FAULT1", e.reason, "ILLEGAL_ADDRESS" in str(e))
    for call in (lambda: be.allocate_buffer(16), lambda: be.read(keep, 0, 4, None),
                 lambda: be.create_stream(), lambda: be.launch(LaunchRequest(None, k, [],
                 [Scalar(DType.U64, 0)], FixedGeometry((1, 1, 1), (1, 1, 1))))):
        try:
            call()
            print("NO-FAULT")
        except DeviceFault:
            print("FAULT-AGAIN")
    try:
        CudaBackend(0)
        print("NEW-OK")
    except DeviceFault:
        print("NEW-FAULT")
    be.close()
    be.close()
    print("CLOSED", be.memory_in_use())
    """
)


def test_sticky_fault_poisons_the_backend() -> None:
    # The child keeps the parent's path too: accyd imports the generated protocol code, which
    # needs the project's protobuf, not whichever one the machine has.
    paths = [str(REPO / "server"), str(REPO / "client"), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
    done = subprocess.run(
        [sys.executable, "-c", FAULT_SCRIPT], env=env, capture_output=True, text=True, timeout=180
    )
    out = done.stdout.split()
    assert done.returncode == 0, done.stderr
    assert "FAULT1" in out and out[out.index("FAULT1") + 1 : out.index("FAULT1") + 3] == [
        "DEVICE_LOST",
        "True",
    ], done.stdout
    assert out.count("FAULT-AGAIN") == 4, done.stdout
    assert "NEW-FAULT" in out and "CLOSED" in out, done.stdout
