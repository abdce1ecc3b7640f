"""Prepared and bound launches let a freed buffer go: nothing cached keeps its memory alive."""

from __future__ import annotations

from accyd.catalog.dtypes import DType, Scalar
from tests.core.daemon_fixtures import host_daemon

SAXPY = "accy.kernel.saxpy"
N = 1024


def test_freeing_a_buffer_drops_the_prepared_launches_that_name_it() -> None:
    daemon, _ = host_daemon()
    try:
        client = daemon.attach("c").id
        session_id = daemon.load_pipeline(client, SAXPY).session_id
        session = daemon.client(client).sessions[session_id]
        scalars = {"n": Scalar.u32(N), "a": Scalar.f32(2.0)}
        for _ in range(5):  # a fresh pair of buffers per step, as a long-lived client does
            x = daemon.allocate_buffer(client, 4 * N, DType.F32)
            y = daemon.allocate_buffer(client, 4 * N, DType.F32)
            daemon.launch(client, session_id, [x.id, y.id], [y.id], scalars)
            daemon.wait_launch(client, session_id)
            assert len(session.prepared) == 1
            daemon.free_buffer(client, x.id)
            daemon.free_buffer(client, y.id)
            assert len(session.prepared) == 0  # the graph naming them is gone with them
    finally:
        daemon.close()
