"""Free scalars on CUDA: one captured graph serves every value of saxpy's ``a``, updated in
place before each launch, while launches already enqueued keep the values they had."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from accyd.backends.cuda import cuda_available
from accyd.backends.cuda.backend import CudaBackend
from accyd.catalog import load_catalog
from accyd.catalog.dtypes import DType, Scalar
from accyd.core.daemon import Daemon

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not cuda_available(), reason="no CUDA driver or device here"),
]

SAXPY = "accy.kernel.saxpy"
N = 1 << 16


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    backend = CudaBackend(0, cache_dir=tmp_path_factory.mktemp("kernel-cache"))
    core = Daemon(load_catalog(), {0: backend})
    yield core
    core.close()


def test_launches_queued_back_to_back_each_keep_their_own_value(daemon: Daemon) -> None:
    client = daemon.attach("free").id
    session = daemon.load_pipeline(client, SAXPY).session_id
    ones = daemon.allocate_buffer(client, 4 * N, DType.F32).id
    acc = daemon.allocate_buffer(client, 4 * N, DType.F32).id
    with daemon.open_write(client, ones) as transfer:
        transfer.write(0, np.ones(N, np.float32).tobytes())
    with daemon.open_write(client, acc) as transfer:
        transfer.write(0, np.zeros(N, np.float32).tobytes())
    values = [float(v) for v in range(1, 201)] + [-0.5, 0.5] * 20
    for value in values:  # no wait between: each graph update must miss the queued ones
        daemon.launch(
            client, session, [ones, acc], [acc], {"n": Scalar.u32(N), "a": Scalar.f32(value)}
        )
    daemon.wait_launch(client, session)
    got = np.frombuffer(daemon.open_read(client, acc).read(0, 4 * N), np.float32)
    assert np.all(got == np.float32(sum(values)))
    assert len(daemon.client(client).sessions[session].prepared) == 1
