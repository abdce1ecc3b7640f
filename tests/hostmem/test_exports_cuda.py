"""Exported buffers on CUDA: the daemon's device memory read and written by CuPy and PyTorch
through DLPack with no copy, ordered after the daemon's work, kept for its one owner."""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from accy import Client, ExportedBuffer
from accy.errors import NotFound
from accy.protocol.launch.v1 import launch_pb2 as pb
from accy.testing import RunningDaemon, call, running_daemon
from accyd.backends.base import ExportKind
from accyd.backends.cuda import cuda_available
from accyd.backends.cuda.backend import CudaBackend
from accyd.errors import FailedPrecondition

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not cuda_available(), reason="no CUDA driver or device here"),
]

SAXPY = "accy.kernel.saxpy"


def library(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        pytest.skip(f"{name} is not installed here")


@pytest.fixture(scope="module", params=["in-process", "worker"])
def daemon(request: pytest.FixtureRequest) -> Iterator[RunningDaemon]:
    env = {"ACCYD_DEVICE_WORKERS": "1" if request.param == "worker" else "0"}
    with running_daemon(backend="cuda", tcp=False, env=env) as running:
        yield running
        assert running.process.poll() is None, f"accyd died:\n{running.log_text()}"


def test_the_backend_exports_vmm_memory_it_can_free(tmp_path: Path) -> None:
    backend = CudaBackend(0, cache_dir=tmp_path)
    try:
        before = backend.memory_in_use()
        buffer = backend.allocate_buffer(3 << 20, zero=True, exportable=True)
        exported = backend.export_buffer(buffer)
        assert exported.kind is ExportKind.CUDA_VMM
        assert exported.mapping_size % (2 << 20) == 0 and exported.mapping_size >= 3 << 20
        assert len(exported.gpu_uuid) == 16
        os.close(exported.fd)
        plain = backend.allocate_buffer(64)
        with pytest.raises(FailedPrecondition, match="not allocated exportable"):
            backend.export_buffer(plain)
        data = np.arange(1 << 18, dtype=np.float32)
        backend.write(buffer, 0, data.tobytes(), None)
        back = np.frombuffer(backend.read(buffer, 0, data.nbytes, None), np.float32)
        np.testing.assert_array_equal(back, data)
        backend.destroy(plain)
        backend.destroy(buffer)
        assert backend.memory_in_use() == before
    finally:
        backend.close()


def test_cupy_and_torch_see_the_daemons_result_with_no_copy(daemon: RunningDaemon) -> None:
    cupy = library("cupy")
    torch = library("torch")
    n = 1 << 22
    rng = np.random.default_rng(9)
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    with Client(daemon.unix_target) as client, client.load(SAXPY) as session:
        bx, by = client.buffer(x), client.buffer(y)
        out = client.empty(n, np.float32, exportable=True)
        session.launch(operands=[bx, by], results=[out], n=n, a=2.0, wait=False)
        with out.export() as view:  # after the launch: no wait of our own
            assert isinstance(view, ExportedBuffer) and view.is_cuda
            got = cupy.from_dlpack(view)
            assert got.data.ptr == view.ptr  # the daemon's memory, not a copy
            np.testing.assert_allclose(cupy.asnumpy(got), np.float32(2.0) * x + y, rtol=1e-6)
            tensor = torch.from_dlpack(view)
            assert tensor.data_ptr() == view.ptr and tensor.is_cuda
            assert float(tensor[5]) == pytest.approx(float(2 * x[5] + y[5]), rel=1e-6)
            via_interface = cupy.asarray(view)
            assert via_interface.data.ptr == view.ptr
            # Written by CuPy, then read by the daemon's next launch once CuPy is done.
            got[:] = 1.0
            cupy.cuda.Device().synchronize()
            session.launch(operands=[out, by], results=[bx], n=n, a=3.0)
            np.testing.assert_allclose(bx.read(), np.float32(3.0) + y, rtol=1e-6)
        assert float(got[0]) == 1.0  # the DLPack array keeps the mapping after close()
        del got, tensor, via_interface


def test_only_the_owner_exports_and_a_freed_buffer_is_not_reused_under_it(
    daemon: RunningDaemon,
) -> None:
    cupy = library("cupy")
    with Client(daemon.unix_target) as alice, Client(daemon.unix_target) as mallory:
        data = np.arange(1 << 20, dtype=np.float32)
        mine = alice.buffer(data, exportable=True)
        with pytest.raises(NotFound):
            call(mallory, "ExportBuffer", pb.ExportBufferRequest(buffer_id=mine.id))
        view = mine.export()
        array = cupy.from_dlpack(view)
        mine.free()
        fresh = mallory.empty(data.size, np.float32, exportable=True)
        with fresh.export() as theirs:
            assert theirs.ptr != 0
            np.testing.assert_array_equal(cupy.asnumpy(cupy.from_dlpack(theirs)), 0)
        np.testing.assert_array_equal(cupy.asnumpy(array), data)  # alice's pages, still hers
        view.close()
        del array


def test_a_large_buffer_exports_whole(daemon: RunningDaemon) -> None:
    cupy = library("cupy")
    n = (6 << 30) // 4  # 6 GiB: a cuda.core pool import of this size crashed its importer
    with Client(daemon.unix_target) as client:
        big = client.empty(n, np.float32, exportable=True)
        with big.export() as view:
            array = cupy.from_dlpack(view)
            array[-1] = 5.0
            array[0] = 7.0
            cupy.cuda.Device().synchronize()
            assert float(array.sum()) == 12.0  # zeroed by the daemon, then our two writes
            del array
        assert big.read(count=1, offset=(n - 1) * 4)[0] == 5.0
        big.free()
