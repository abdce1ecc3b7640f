"""Host-shared buffers on CUDA: segments page-locked once, copies checked, unpinned on close."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from accy import Client
from accy.testing import RunningDaemon, running_daemon
from accyd.backends.cuda import cuda_available
from accyd.backends.cuda.backend import CudaBackend
from accyd.core.clients import Client as DaemonClient
from accyd.core.tenants import Tenant
from accyd.doors.hostmem.segment import HostSegment

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not cuda_available(), reason="no CUDA driver or device here"),
]

SAXPY = "accy.kernel.saxpy"


@pytest.fixture(scope="module")
def daemon() -> Iterator[RunningDaemon]:
    with running_daemon(backend="cuda", tcp=False) as running:
        yield running


def test_a_segment_is_pinned_copied_with_and_unpinned(tmp_path: Path) -> None:
    backend = CudaBackend(0, cache_dir=tmp_path)
    try:
        owner = DaemonClient("cli_test", "test", Tenant("test"))
        segment = HostSegment("seg_test", owner, 64 << 20, 0, backend)
        data = np.frombuffer(segment.view, dtype=np.uint8)
        data[:] = np.arange(data.size, dtype=np.uint64).astype(np.uint8)
        buffer = backend.allocate_buffer(64 << 20)
        stream = backend.create_stream()
        backend.write(buffer, 0, segment.range(0, 64 << 20), stream)
        back = np.empty(64 << 20, np.uint8)
        backend.read_into(buffer, 0, back, stream)
        np.testing.assert_array_equal(back, data)
        del data
        segment.close()
        segment.close()  # idempotent
        backend.destroy(buffer)
        backend.destroy_stream(stream)
    finally:
        backend.close()


def test_shared_memory_transfers_are_checked_on_cuda(daemon: RunningDaemon) -> None:
    n = 16 << 20
    rng = np.random.default_rng(5)
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    with Client(daemon.unix_target) as client, client.load(SAXPY) as session:
        bx, by, out = client.buffer(x), client.buffer(y), client.empty(n, np.float32)
        session.launch(operands=[bx, by], results=[out], n=n, a=3.0)
        shared = client.shared_array(n, np.float32)
        out.read(out=shared)
        # The device fuses the multiply-add: near zero only an absolute tolerance is fair.
        np.testing.assert_allclose(shared, np.float32(3.0) * x + y, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(out.read(), shared)
