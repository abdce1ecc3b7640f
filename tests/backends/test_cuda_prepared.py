"""Prepared launches on CUDA: a pipeline captured as one graph computes what per-stage launches do.

The daemon replays a session's launch through a cached graph when the same
buffers and scalars come again; the result must match float64 numpy every
time, a scratch swap must drop graphs that name the old scratch, and device
memory must return to where it started.
"""

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

SCAN = "accy.kernel.device_scan"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    backend = CudaBackend(0, cache_dir=tmp_path_factory.mktemp("kernel-cache"))
    core = Daemon(load_catalog(), {0: backend})
    yield core
    core.close()


def _write(daemon: Daemon, client: str, buffer_id: str, data: np.ndarray) -> None:
    with daemon.open_write(client, buffer_id) as transfer:
        transfer.write(0, data.tobytes())


def _read(daemon: Daemon, client: str, buffer_id: str, n: int) -> np.ndarray:
    return np.frombuffer(daemon.open_read(client, buffer_id).read(0, 4 * n), np.float32)


@pytest.mark.parametrize("n", [1, 5000, 4096 * 300 + 5])
def test_replayed_graph_scans_match_numpy(daemon: Daemon, n: int) -> None:
    client = daemon.attach("graphs").id
    baseline = daemon.backend.memory_in_use()
    session = daemon.load_pipeline(client, SCAN).session_id
    xs = daemon.allocate_buffer(client, 4 * n, DType.F32).id
    ys = daemon.allocate_buffer(client, 4 * n, DType.F32).id
    scalars = {"n": Scalar.u32(n)}
    daemon.allocate_intermediates(client, session, scalars)
    rng = np.random.default_rng(n)
    for round_ in range(4):  # the first launch prepares the graph, the rest replay it
        x = rng.random(n, dtype=np.float32)
        _write(daemon, client, xs, x)
        _write(daemon, client, ys, np.full(n, np.nan, np.float32))
        daemon.launch(client, session, [xs], [ys], scalars)
        daemon.wait_launch(client, session)
        got = _read(daemon, client, ys, n)
        want = np.cumsum(x, dtype=np.float64)
        assert np.all(np.isfinite(got)), f"round {round_}: an element was not written"
        assert np.max(np.abs(got - want) / np.maximum(1.0, np.abs(want))) < 1e-4
    # Larger scalars swap the scratch: graphs naming the old scratch must not run again.
    bigger = {"n": Scalar.u32(n + 4096)}
    zs = daemon.allocate_buffer(client, 4 * (n + 4096), DType.F32).id
    ws = daemon.allocate_buffer(client, 4 * (n + 4096), DType.F32).id
    last = x
    x = rng.random(n + 4096, dtype=np.float32)
    _write(daemon, client, zs, x)
    _write(daemon, client, ys, np.full(n, np.nan, np.float32))
    daemon.allocate_intermediates(client, session, bigger)
    daemon.launch(client, session, [zs], [ws], bigger)
    daemon.launch(client, session, [xs], [ys], scalars)
    daemon.wait_launch(client, session)
    assert np.allclose(_read(daemon, client, ws, n + 4096), np.cumsum(x, dtype=np.float64), 1e-4)
    assert np.allclose(_read(daemon, client, ys, n), np.cumsum(last, dtype=np.float64), 1e-4)
    daemon.detach(client)
    assert daemon.backend.memory_in_use() == baseline


def test_a_ticketed_launch_replays_a_run_as_one_graph_loop(daemon: Daemon) -> None:
    """A ticket's graph launched ``count`` times in a row runs in stream order (as the engine
    launches a run of identical records)."""
    n = 4096
    client = daemon.attach("graph-runs").id
    session = daemon.load_pipeline(client, "accy.kernel.saxpy").session_id
    acc = daemon.allocate_buffer(client, 4 * n, DType.F32).id
    ones = daemon.allocate_buffer(client, 4 * n, DType.F32).id
    _write(daemon, client, acc, np.zeros(n, np.float32))
    _write(daemon, client, ones, np.ones(n, np.float32))
    scalars = {"n": Scalar.u32(n), "a": Scalar.f32(1.0)}
    ticket = daemon.launch(client, session, [acc, ones], [acc], scalars, ticket_for="test")
    fast = ticket.fast
    assert fast is None  # no engine here takes tickets: the core offers none
    daemon.wait_launch(client, session)
    loaded = daemon._t.clients.get(client).sessions[session]
    [entry] = loaded.prepared._entries.values()
    assert entry.launch is not None
    for count in (1, 7, 16):  # acc = 1 * acc + 1, count times in a row on its stream
        entry.launch.launch(loaded.stream, count)
    daemon.wait_launch(client, session)
    loaded.backend.synchronize(loaded.stream)
    assert np.all(_read(daemon, client, acc, n) == 25.0)
    daemon.detach(client)
