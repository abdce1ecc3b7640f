"""Each built-in CUDA kernel against its contract and a float64 numpy reference, at edge sizes.

Inputs are fresh random data; outputs are poisoned with NaN before each run and
carry a NaN guard zone past their end, so every element must be written and
nothing past ``n`` may be.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import numpy.typing as npt
import pytest

from accyd.backends.base import ArtifactRequest, DeviceBuffer, LaunchRequest, LoadedKernel
from accyd.backends.cuda import cuda_available
from accyd.backends.cuda.backend import CudaBackend
from accyd.catalog import ArtifactFormat, Scalar, load_catalog
from accyd.catalog.model import KernelEntry, check_geometry
from accyd.core.executor import allocate_intermediates

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not cuda_available(), reason="no CUDA driver or device here"),
]

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]

TILE = 4096
GUARD = 1024  # elements of NaN past each output that must stay untouched
N_SIZES = [1, 63, 64, 65, 4095, 4096, 4097, 5000, 8191, 8192, 8193, 2**20 + 3, 2**28 + 7]
M_SIZES = [1, 63, 64, 65, 4095, 4096, 4097, 5000, 16383, 16384, 16385, 65537, 2**17 + 3, 2**18]
CHUNK_ROWS = 8192  # tiles per chunk of the float64 references (32 Mi elements)

CATALOG = load_catalog()
SCAN = CATALOG.find_pipeline("accy.kernel.device_scan")
"""Its scratch (state, zeroed, then partials) is made as a session's is, by
``allocate_intermediates`` from the manifest: the tests never write the single pass's tile."""


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CudaBackend]:
    be = CudaBackend(0, cache_dir=tmp_path_factory.mktemp("kernel-cache"))
    yield be
    be.close()


Runner = Callable[[str, list[DeviceBuffer], list[Scalar]], None]


@pytest.fixture(scope="module")
def run(backend: CudaBackend) -> Iterator[Runner]:
    loaded: dict[str, tuple[KernelEntry, LoadedKernel]] = {}

    def launch(target: str, buffers: list[DeviceBuffer], scalars: list[Scalar]) -> None:
        if target not in loaded:
            entry = CATALOG.registry.find(target, 1, ArtifactFormat.CUDA_CPP)
            assert entry is not None, target
            artifact = backend.create_artifact(
                ArtifactRequest(
                    entry.entry_name,
                    entry.format,
                    entry.argument_count,
                    entry.scalar_argument_count(),
                    entry.payload,
                    origin=entry.origin,
                )
            )
            loaded[target] = (entry, backend.load_artifact(artifact))
            artifact.close()
        entry, kernel = loaded[target]
        geometry = entry.launch.resolve(scalars)
        check_geometry(geometry)
        backend.launch(
            LaunchRequest(None, kernel, buffers, scalars, geometry, None, entry.shared_memory_bytes)
        )

    yield launch
    for _, kernel in loaded.values():
        backend.destroy(kernel)


# -- helpers -----------------------------------------------------------------------------------


def upload(be: CudaBackend, array: F32) -> DeviceBuffer:
    buffer = be.allocate_buffer(array.nbytes)
    be.write(buffer, 0, memoryview(array), None)
    return buffer


def poisoned(be: CudaBackend, count: int) -> DeviceBuffer:
    buffer = be.allocate_buffer((count + GUARD) * 4)
    be.write(buffer, 0, memoryview(np.full(count + GUARD, np.nan, dtype=np.float32)), None)
    return buffer


def download(be: CudaBackend, buffer: DeviceBuffer, count: int) -> F32:
    """The first ``count`` elements; asserts all were written and the guard zone was not."""
    out = np.empty(count + GUARD, dtype=np.float32)
    be.read_into(buffer, 0, out, None)
    assert np.isnan(out[count:]).all(), "a kernel wrote past the end of its output"
    got = out[:count]
    assert np.isfinite(got).all(), (
        f"{int(np.count_nonzero(~np.isfinite(got)))} of {count} outputs never written"
    )
    return got


def rel_l2(pairs: Iterator[tuple[F32, F64]]) -> float:
    err = ref = 0.0
    for got, want in pairs:
        err += float(np.sum(np.square(got.astype(np.float64) - want)))
        ref += float(np.sum(np.square(want)))
    return float(np.sqrt(err / ref)) if ref else float(np.sqrt(err))


def data(rng: np.random.Generator, n: int) -> F32:
    """Uniform in [-0.25, 0.75): signed, with a drift so sums stay away from zero."""
    x = rng.random(n, dtype=np.float32)
    x -= np.float32(0.25)
    return x


def tile_sums_reference(x: F32) -> F64:
    n = x.size
    full = n // TILE
    sums = np.empty(-(-n // TILE), dtype=np.float64)
    sums[:full] = x[: full * TILE].reshape(full, TILE).sum(axis=1, dtype=np.float64)
    if n % TILE:
        sums[full] = x[full * TILE :].sum(dtype=np.float64)
    return sums


def tile_scan_pairs(y: F32, x: F32, offsets: F32) -> Iterator[tuple[F32, F64]]:
    """(got, want) chunks of y against offsets[tile] + the in-tile inclusive scan of x."""
    n = x.size
    full = n // TILE
    for row in range(0, full, CHUNK_ROWS):
        rows = min(CHUNK_ROWS, full - row)
        block = x[row * TILE : (row + rows) * TILE].reshape(rows, TILE)
        want = np.cumsum(block, axis=1, dtype=np.float64)
        want += offsets[row : row + rows, None].astype(np.float64)
        yield y[row * TILE : (row + rows) * TILE], want.reshape(-1)
    if n % TILE:
        tail = np.cumsum(x[full * TILE :], dtype=np.float64) + np.float64(offsets[full])
        yield y[full * TILE :], tail


def global_scan_pairs(y: F32, x: F32) -> Iterator[tuple[F32, F64]]:
    carry = 0.0
    step = CHUNK_ROWS * TILE
    for start in range(0, x.size, step):
        want = np.cumsum(x[start : start + step], dtype=np.float64)
        want += carry
        carry = float(want[-1])
        yield y[start : start + step], want


# -- the kernels -------------------------------------------------------------------------------


@pytest.mark.parametrize("n", N_SIZES)
def test_tile_sum(backend: CudaBackend, run: Runner, n: int) -> None:
    rng = np.random.default_rng()
    x = data(rng, n)
    m = -(-n // TILE)
    dx, dsums = upload(backend, x), poisoned(backend, m)
    try:
        run("accy.kernel.scan.tile_sum", [dsums, dx], [Scalar.u32(n)])
        got = download(backend, dsums, m)
    finally:
        backend.destroy(dx)
        backend.destroy(dsums)
    assert rel_l2(iter([(got, tile_sums_reference(x))])) < 1e-5


@pytest.mark.parametrize("m", M_SIZES)
def test_tile_offsets(backend: CudaBackend, run: Runner, m: int) -> None:
    rng = np.random.default_rng()
    sums = data(rng, m) * np.float32(4096.0)
    dsums, doffsets = upload(backend, sums), poisoned(backend, m)
    try:
        run("accy.kernel.scan.tile_offsets", [doffsets, dsums], [Scalar.u32(m)])
        got = download(backend, doffsets, m)
    finally:
        backend.destroy(dsums)
        backend.destroy(doffsets)
    assert got[0] == 0.0
    want = np.zeros(m, dtype=np.float64)
    np.cumsum(sums[:-1], dtype=np.float64, out=want[1:])
    assert rel_l2(iter([(got, want)])) < 1e-5


@pytest.mark.parametrize("n", N_SIZES)
def test_tile_scan(backend: CudaBackend, run: Runner, n: int) -> None:
    rng = np.random.default_rng()
    x = data(rng, n)
    m = -(-n // TILE)
    offsets = data(rng, m) * np.float32(1000.0)
    dx, doff, dy = upload(backend, x), upload(backend, offsets), poisoned(backend, n)
    try:
        run("accy.kernel.scan.tile_scan", [dy, dx, doff], [Scalar.u32(n)])
        got = download(backend, dy, n)
    finally:
        for b in (dx, doff, dy):
            backend.destroy(b)
    assert rel_l2(tile_scan_pairs(got, x, offsets)) < 1e-5


@pytest.fixture(scope="module")
def scan_scratch(backend: CudaBackend) -> Iterator[list[DeviceBuffer]]:
    """device_scan's state (zeroed) and partials for the largest size, kept across the tests
    and their sizes as one session's scratch is kept across its launches."""
    scratch = allocate_intermediates(backend, SCAN, [Scalar.u32(max(N_SIZES))])
    yield list(scratch.buffers)
    scratch.close()


def repoison(be: CudaBackend, buffer: DeviceBuffer, count: int) -> None:
    be.write(buffer, 0, memoryview(np.full(count + GUARD, np.nan, dtype=np.float32)), None)


@pytest.mark.parametrize("n", N_SIZES)
def test_single_pass_scan(
    backend: CudaBackend, run: Runner, scan_scratch: list[DeviceBuffer], n: int
) -> None:
    """Each size three times on the same scratch: every launch leaves the next a good state."""
    x = data(np.random.default_rng(), n)
    dx, dy = upload(backend, x), poisoned(backend, n)
    try:
        for _ in range(3):
            run("accy.kernel.scan.single_pass", [dy, *scan_scratch, dx], [Scalar.u32(n)])
            got = download(backend, dy, n)
            assert rel_l2(global_scan_pairs(got, x)) < 1e-5
            repoison(backend, dy, n)
    finally:
        backend.destroy(dx)
        backend.destroy(dy)


def test_single_pass_scan_back_to_back(
    backend: CudaBackend, run: Runner, scan_scratch: list[DeviceBuffer]
) -> None:
    """200 launches queued without a wait, sizes alternating, each into its own output."""
    sizes = [5000, 2**20 + 3, 1, 8193, 2**16]
    rng = np.random.default_rng()
    inputs = {n: data(rng, n) for n in sizes}
    dxs = {n: upload(backend, x) for n, x in inputs.items()}
    dys = {n: poisoned(backend, n) for n in sizes}
    try:
        for i in range(200):
            n = sizes[i % len(sizes)]
            run("accy.kernel.scan.single_pass", [dys[n], *scan_scratch, dxs[n]], [Scalar.u32(n)])
        for n in sizes:
            assert rel_l2(global_scan_pairs(download(backend, dys[n], n), inputs[n])) < 1e-5
    finally:
        for buffer in [*dxs.values(), *dys.values()]:
            backend.destroy(buffer)


@pytest.mark.parametrize("m", M_SIZES)
def test_final_sum(backend: CudaBackend, run: Runner, m: int) -> None:
    rng = np.random.default_rng()
    partials = data(rng, m) * np.float32(4096.0)
    dp, dout = upload(backend, partials), poisoned(backend, 1)
    try:
        run("accy.kernel.reduce.final_sum", [dout, dp], [Scalar.u32(m)])
        got = download(backend, dout, 1)
    finally:
        backend.destroy(dp)
        backend.destroy(dout)
    want = partials.sum(dtype=np.float64)
    assert abs(float(got[0]) - want) <= 1e-5 * abs(want)


@pytest.mark.parametrize("n", N_SIZES)
def test_saxpy(backend: CudaBackend, run: Runner, n: int) -> None:
    rng = np.random.default_rng()
    x, y = data(rng, n), data(rng, n)
    a = float(np.float32(rng.uniform(-3, 3)))
    dx, dy, dout = upload(backend, x), upload(backend, y), poisoned(backend, n)
    try:
        run("accy.kernel.saxpy", [dout, dx, dy], [Scalar.u32(n), Scalar.f32(a)])
        got = download(backend, dout, n)
    finally:
        for b in (dx, dy, dout):
            backend.destroy(b)
    want = a * x.astype(np.float64) + y
    assert rel_l2(iter([(got, want)])) < 1e-6


@pytest.mark.parametrize("n", [1, 4097, 5000, 2**20 + 3])
@pytest.mark.parametrize("alias", ["x", "y"])
def test_saxpy_in_place(backend: CudaBackend, run: Runner, n: int, alias: str) -> None:
    rng = np.random.default_rng()
    x, y = data(rng, n), data(rng, n)
    a = -1.25
    want = a * x.astype(np.float64) + y
    dx = backend.allocate_buffer((n + GUARD) * 4)
    dy = backend.allocate_buffer((n + GUARD) * 4)
    nan_tail = np.full(GUARD, np.nan, dtype=np.float32)
    backend.write(dx, 0, memoryview(np.concatenate([x, nan_tail])), None)
    backend.write(dy, 0, memoryview(np.concatenate([y, nan_tail])), None)
    try:
        out = dx if alias == "x" else dy
        run("accy.kernel.saxpy", [out, dx, dy], [Scalar.u32(n), Scalar.f32(a)])
        got = download(backend, out, n)
        other = download(backend, dy if alias == "x" else dx, n)
    finally:
        backend.destroy(dx)
        backend.destroy(dy)
    assert rel_l2(iter([(got, want)])) < 1e-6
    assert np.array_equal(other, y if alias == "x" else x)


@pytest.mark.slow
def test_scan_and_reduce_chains_at_2_30(backend: CudaBackend, run: Runner) -> None:
    """n = 2^30 (4 GiB per buffer): byte offsets past 2^32, m = 262144 tiles."""
    n = 2**30
    m = n // TILE
    rng = np.random.default_rng()
    x = rng.random(n, dtype=np.float32)
    dx = upload(backend, x)
    dsums, doffsets, dtotal = poisoned(backend, m), poisoned(backend, m), poisoned(backend, 1)
    dy = poisoned(backend, n)
    try:
        run("accy.kernel.scan.tile_sum", [dsums, dx], [Scalar.u32(n)])
        run("accy.kernel.reduce.final_sum", [dtotal, dsums], [Scalar.u32(m)])
        run("accy.kernel.scan.tile_offsets", [doffsets, dsums], [Scalar.u32(m)])
        run("accy.kernel.scan.tile_scan", [dy, dx, doffsets], [Scalar.u32(n)])
        total = download(backend, dtotal, 1)
        y = download(backend, dy, n)
        assert rel_l2(global_scan_pairs(y, x)) < 1e-5
        repoison(backend, dy, n)
        scratch = allocate_intermediates(backend, SCAN, [Scalar.u32(n)])
        try:
            run("accy.kernel.scan.single_pass", [dy, *scratch.buffers, dx], [Scalar.u32(n)])
            y = download(backend, dy, n)
        finally:
            scratch.close()
    finally:
        for b in (dx, dsums, doffsets, dtotal, dy):
            backend.destroy(b)
    want_total = x.sum(dtype=np.float64)
    assert abs(float(total[0]) - want_total) <= 1e-5 * want_total
    assert rel_l2(global_scan_pairs(y, x)) < 1e-5
