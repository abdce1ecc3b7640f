"""SM partitions on a GPU: green contexts made once, the primary context's kernels, graphs,
buffers and events working on their streams, their blocks on the partition's SMs only
(launched and replayed as a graph), and a tenant's ring launches confined there."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from accyd.backends.base import ArtifactRequest, LaunchRequest, Stream
from accyd.backends.cuda import cuda_available
from accyd.backends.partitions import PartitionSpec
from accyd.catalog import ArtifactFormat, load_catalog
from accyd.catalog.dtypes import DType, Scalar
from accyd.catalog.entries import FixedGeometry
from accyd.core.daemon import Daemon
from accyd.core.tenants import Placement
from accyd.errors import FailedPrecondition, UnsupportedOperation
from accyd.tokens import hash_token

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not cuda_available(), reason="no CUDA driver or device here"),
]

SAXPY = "accy.kernel.saxpy"
N = 1 << 16
BLOCKS = 1024
SMID = r"""
extern "C" __global__ void accy_test_smid(unsigned int* out, unsigned int spin) {
    unsigned int id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    const long long start = clock64();
    while (clock64() - start < (long long)spin) {}
    if (threadIdx.x == 0) out[blockIdx.x] = id;
}
"""


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[object]:
    from accyd.backends.cuda.backend import CudaBackend

    made = CudaBackend(0, cache_dir=tmp_path / "cache")
    yield made
    made.close()


def test_the_device_splits_into_whole_steps_once(backend: object) -> None:
    from accyd.backends.cuda.backend import CudaBackend

    assert isinstance(backend, CudaBackend)
    split = backend.split_sms([PartitionSpec("small", sms=16), PartitionSpec("half", share=0.5)])
    assert split.unconfined == "", split.unconfined
    assert split.total_sms == backend.multiprocessor_count
    small, half = split.partitions
    assert (small.name, half.name) == ("small", "half")
    assert small.sms == 16 and half.sms % 8 == 0 and 0 < half.sms <= split.total_sms // 2
    stream = backend.create_stream("half", 3)
    assert stream.partition == "half"
    backend.synchronize(stream)
    backend.destroy_stream(stream)
    with pytest.raises(UnsupportedOperation, match="no SM partition 'nope'"):
        backend.create_stream("nope")
    with pytest.raises(FailedPrecondition, match="split already"):
        backend.split_sms([PartitionSpec("again", sms=8)])


def test_more_sms_than_the_device_has_leave_it_unconfined(backend: object) -> None:
    from accyd.backends.cuda.backend import CudaBackend

    assert isinstance(backend, CudaBackend)
    split = backend.split_sms([PartitionSpec("huge", sms=4096)])
    assert split.partitions == () and "more than the device's" in split.unconfined
    with pytest.raises(UnsupportedOperation):
        backend.create_stream("huge")


def test_blocks_run_on_the_partitions_sms_launched_and_replayed(backend: object) -> None:
    """Each block writes the SM it ran on: launched on a partition's stream, and replayed as
    a prepared graph there, a grid of 1024 blocks uses at most the partition's 16 SMs (a
    graph captured on a primary-context stream used every SM of the GPU); on the whole
    device, more."""
    from accyd.backends.cuda.backend import CudaBackend

    assert isinstance(backend, CudaBackend)
    split = backend.split_sms([PartitionSpec("small", sms=16)])
    assert split.unconfined == "", split.unconfined
    artifact = backend.create_artifact(
        ArtifactRequest("accy_test_smid", ArtifactFormat.CUDA_CPP, 2, 1, SMID, origin="smid.cu")
    )
    kernel = backend.load_artifact(artifact)
    artifact.close()
    out = backend.allocate_buffer(4 * BLOCKS)
    confined, whole = backend.create_stream("small"), backend.create_stream()

    geometry = FixedGeometry((BLOCKS, 1, 1), (64, 1, 1))

    def sms_used(stream: Stream, prepared: bool) -> int:
        request = LaunchRequest(None, kernel, [out], [Scalar.u32(20_000)], geometry, stream)
        if prepared:
            graph = backend.prepare([request])
            graph.launch(stream)
            backend.synchronize(stream)
            graph.close()
        else:
            backend.launch(request)
            backend.synchronize(stream)
        ids = np.empty(BLOCKS, np.uint32)
        backend.read_into(out, 0, ids, None)
        return len(set(ids.tolist()))

    try:
        assert sms_used(confined, prepared=False) <= 16
        assert sms_used(confined, prepared=True) <= 16
        assert sms_used(whole, prepared=True) > 16
    finally:
        backend.destroy_stream(confined)
        backend.destroy_stream(whole)
        backend.destroy(out)
        backend.destroy(kernel)


def test_a_confined_tenants_launches_compute_on_its_partition(tmp_path: Path) -> None:
    """Kernels loaded in the primary context, its buffers and events, graphs replayed: all on
    a green context's stream, with a session of another tenant on the whole device beside."""
    from accyd.backends.cuda.backend import CudaBackend

    daemon = Daemon(load_catalog(), {0: CudaBackend(0, cache_dir=tmp_path / "cache")})
    try:
        daemon.split_sms([PartitionSpec("batch", sms=32)], {"a": Placement("batch", 2)})
        assert daemon.status().devices[0].partitions[0].sms == 32
        x = np.arange(N, dtype=np.float32)
        for tenant in ("a", "b"):
            client = daemon.attach(tenant, tenant=tenant).id
            session = daemon.load_pipeline(client, SAXPY).session_id
            xs = daemon.allocate_buffer(client, 4 * N, DType.F32).id
            ys = daemon.allocate_buffer(client, 4 * N, DType.F32).id
            with daemon.open_write(client, xs) as transfer:
                transfer.write(0, x.tobytes())
            scalars = {"n": Scalar(DType.U32, N), "a": Scalar(DType.F32, 1.0)}
            for _ in range(20):  # the first launch, then replays of its prepared graph
                daemon.launch(client, session, [xs, ys], [ys], scalars)
            daemon.wait_launch(client, session)
            y = np.frombuffer(daemon.open_read(client, ys).read(0, 4 * N), np.float32)
            np.testing.assert_array_equal(y, x * 20)
        (device,) = daemon.status().devices
        assert device.partitions[0].sessions == 1  # tenant a's; b's runs on the whole GPU
    finally:
        daemon.close()


def test_ring_launches_of_a_confined_tenant_through_the_daemon(tmp_path: Path) -> None:
    """``accyd serve`` with a tokens file placing the tenant: its waited ring launches, which
    the native engine launches on the partition's stream, compute."""
    from accy import Client
    from accy.testing import running_daemon

    token = "accy_partition-test-token"
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        '[partitions]\nbatch = { sms = 64 }\n[tenant.a]\npartition = "batch"\npriority = 1\n'
        f'[[token]]\ntenant = "a"\nsha256 = "{hash_token(token)}"\n'
    )
    extra = ["--tokens", str(tokens), "--unix-trusted"]
    with running_daemon(backend="cuda", tcp=False, extra=extra) as daemon:
        with Client(daemon.unix_target, token=token) as client:
            session = client.load(SAXPY)
            x = client.buffer(np.ones(N, np.float32))
            y = client.buffer(np.zeros(N, np.float32))
            for _ in range(100):
                session.launch(operands=[x, y], results=[y], n=N, a=1.0, wait=True)
            assert float(y.read()[0]) == 100.0
        log = daemon.log.read_text(errors="replace")
        assert "SM partitions of device 0" in log and "unconfined" not in log, log[-3000:]
