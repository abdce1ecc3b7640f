"""Device workers on the CUDA backend: pipelines, graphs, notifications, a sticky fault, replace."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from accyd.backends.base import BackendKind
from accyd.backends.cuda import cuda_available
from accyd.backends.worker.front.pool import DevicePool
from accyd.backends.worker.front.proxy import WorkerBackend
from accyd.catalog import ArtifactFormat, Scalar, load_catalog
from accyd.core.executor import (
    PipelineLaunch,
    allocate_intermediates,
    launch_pipeline,
    load_pipeline_artifacts,
    plan_launch,
)
from accyd.core.prepared import prepare_pipeline
from accyd.errors import DeviceFault
from accyd.process.exits import EXIT_DEVICE_LOST
from tests.pipeline_harness import CASES, download, run_case, upload
from tests.worker_backend.test_faults import eventually

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not cuda_available(), reason="no CUDA driver or device here"),
]

FAULTY = Path(__file__).resolve().parents[1] / "catalogs" / "faulty"
CATALOG = load_catalog([FAULTY])
CUDA = ArtifactFormat.CUDA_CPP


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerBackend]:
    backend = WorkerBackend("cuda", 0, cache_dir=tmp_path_factory.mktemp("kernel-cache"))
    yield backend
    backend.close()


@pytest.mark.parametrize("target", sorted(CASES))
@pytest.mark.parametrize("pooled", [False, True], ids=["owned", "pooled"])
def test_builtin_pipelines_in_a_cuda_worker(
    worker: WorkerBackend, target: str, pooled: bool
) -> None:
    assert worker.kind is BackendKind.CUDA
    for n in (1, 4097, 2**20 + 3):
        error = run_case(worker, CATALOG, CUDA, CASES[target], n, seed=n + pooled, pooled=pooled)
        assert error < CASES[target].tolerance
    assert worker.memory_in_use() == 0


def test_a_prepared_graph_replays_through_the_worker(worker: WorkerBackend) -> None:
    pipeline = CATALOG.find_pipeline("accy.kernel.saxpy")
    n, a = 100_003, 1.75
    rng = np.random.default_rng(5)
    x, y = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
    stream = worker.create_stream()
    operands = [upload(worker, x, stream), upload(worker, y, stream)]
    result = upload(worker, np.zeros(n, dtype=np.float32), stream)
    scalars = [Scalar.u32(n), Scalar.f32(a)]
    with (
        load_pipeline_artifacts(worker, pipeline, CATALOG.registry, CUDA) as pool,
        allocate_intermediates(worker, pipeline, scalars) as scratch,
    ):
        request = PipelineLaunch(
            pipeline, CATALOG.registry, CUDA, operands, [result], scalars,
            intermediates=scratch.buffers, artifacts=pool, stream=stream,
        )  # fmt: skip
        plan = plan_launch(pipeline, CATALOG.registry, CUDA, operands, [result], scalars)
        prepared = prepare_pipeline(worker, request, plan)
        for _ in range(3):
            prepared.launch(stream)
        event = worker.record_event(stream)
        reached = threading.Event()
        worker.notify_event(event, stream, reached.set)  # a host function in the worker
        assert reached.wait(10)
        worker.synchronize_event(event)
        got = download(worker, result, n, stream)
        prepared.close()
        worker.destroy_event(event)
    np.testing.assert_allclose(got, a * x.astype(np.float64) + y, rtol=1e-6)
    for buffer in (*operands, result):
        worker.destroy(buffer)
    worker.destroy_stream(stream)


def test_a_sticky_fault_ends_its_worker_and_replace_serves_again(tmp_path: Path) -> None:
    faults: list[tuple[int, DeviceFault]] = []
    pool = DevicePool("cuda", [0], cache_dir=tmp_path, on_fault=lambda d, f: faults.append((d, f)))
    try:
        assert pool.wait_for_spares(120)
        backend = pool.backends[0]
        assert isinstance(backend, WorkerBackend)
        x = upload(backend, np.ones(64, dtype=np.float32))
        y = upload(backend, np.zeros(64, dtype=np.float32))
        pipeline = CATALOG.find_pipeline("accy.test.fault")
        with pytest.raises(DeviceFault, match=r"ILLEGAL_ADDRESS|illegal"):
            launch_pipeline(
                backend,
                PipelineLaunch(pipeline, CATALOG.registry, CUDA, [x], [y], [Scalar.u32(64)]),
            )
        assert eventually(lambda: len(faults) == 1, 30)
        assert faults[0][0] == 0
        with pytest.raises(DeviceFault, match=r"device worker for device 0 \(cuda\) faulted"):
            backend.allocate_buffer(64)
        backend.destroy(x)
        backend.destroy(y)
        assert eventually(lambda: backend.reaped, 30)
        assert backend.returncode == EXIT_DEVICE_LOST
        started = time.perf_counter()
        fresh = pool.replace(0)
        took = time.perf_counter() - started
        print(f"replace after a CUDA fault: {took * 1000:.2f} ms")
        assert took < 1.0
        case = CASES["accy.kernel.saxpy"]
        assert run_case(fresh, CATALOG, CUDA, case, 4097, seed=3, pooled=True) < case.tolerance
    finally:
        pool.close()
    assert len(faults) == 1


def test_a_cuda_worker_killed_while_idle_is_reported(tmp_path: Path) -> None:
    faults: list[DeviceFault] = []
    backend = WorkerBackend("cuda", 0, cache_dir=tmp_path, on_fault=faults.append)
    buffer = backend.allocate_buffer(1 << 20)
    assert buffer.address != 0  # a real device pointer
    os.kill(backend.pid, signal.SIGKILL)
    assert eventually(lambda: len(faults) == 1, 30)
    assert "killed by SIGKILL" in faults[0].message
    backend.close()


def test_a_segment_pinned_through_a_cuda_worker_copies_with_no_bytes_on_the_channel(
    worker: WorkerBackend,
) -> None:
    from accyd.backends.worker.front.pins import PinnedRange
    from accyd.backends.worker.protocol import Op
    from tests.worker_backend.conftest import traffic
    from tests.worker_backend.test_shared_memory import Segment, mapped_in

    half = 32 << 20
    segment = Segment(2 * half)
    before = mapped_in(worker.pid)
    pinned = worker.pin_host(segment.view, fd=segment.fd)  # cuMemHostRegister in the worker
    buffer = worker.allocate_buffer(half)
    try:
        assert isinstance(pinned, PinnedRange)
        assert mapped_in(worker.pid) == before + 1
        data = np.random.default_rng(9).integers(0, 256, half, dtype=np.uint8)
        segment.array[:half] = data
        stream = worker.create_stream()
        with traffic(worker) as moved:
            worker.write(buffer, 0, segment.view[:half], stream)
            worker.read_into(buffer, 0, segment.view[half:], stream)
        worker.destroy_stream(stream)
        assert moved.calls == [Op.WRITE_SHARED, Op.READ_SHARED]
        assert moved.sent < 2048 and moved.received == 0
        np.testing.assert_array_equal(segment.array[half:], data)
    finally:
        worker.destroy(buffer)
        worker.unpin_host(pinned)
        segment.close()
    assert mapped_in(worker.pid) == before
