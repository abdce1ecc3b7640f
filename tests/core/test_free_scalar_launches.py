"""Launches whose free scalars change: one prepared launch serves every value, given each
launch's own values before it runs, where the backend's prepared launches take them."""

from __future__ import annotations

import math

import numpy as np

from accyd.backends.host import HostBackend
from accyd.catalog import ArtifactFormat, load_catalog
from accyd.catalog.dtypes import DType, Scalar
from accyd.core.daemon import Daemon
from accyd.core.free_scalars import free_scalars_of
from accyd.core.prepared import key_of
from accyd.testing.recording import RecordingBackend
from tests.core.daemon_fixtures import host_daemon
from tests.ring.test_ring_core import read, write

SAXPY = "accy.kernel.saxpy"
N = 256


class BakingBackend(HostBackend):
    """A host backend whose prepared launches keep the values they were made with (as a
    CUDA graph does here for now)."""

    @property
    def prepared_takes_scalars(self) -> bool:
        return False


def accumulate(daemon: Daemon, values: list[float], n: int = N) -> tuple[np.ndarray, int]:
    """``acc += a * ones`` for each ``a``; the sums and the session's prepared launches."""
    client = daemon.attach("c").id
    session_id = daemon.load_pipeline(client, SAXPY).session_id
    ones = daemon.allocate_buffer(client, 4 * N, DType.F32).id
    acc = daemon.allocate_buffer(client, 4 * N, DType.F32).id
    write(daemon, client, ones, np.ones(N, np.float32))
    write(daemon, client, acc, np.zeros(N, np.float32))
    for value in values:
        scalars = {"n": Scalar.u32(n), "a": Scalar.f32(value)}
        daemon.launch(client, session_id, [ones, acc], [acc], scalars)
    daemon.wait_launch(client, session_id)
    sums = read(daemon, client, acc, N)
    return sums, len(daemon.client(client).sessions[session_id].prepared)


def test_saxpy_a_is_free_and_passed_through_where_the_stage_takes_it() -> None:
    catalog = load_catalog()
    saxpy = catalog.find_pipeline(SAXPY)
    free = free_scalars_of(saxpy, catalog.registry, ArtifactFormat.HOST_PY)
    assert free is not None
    [a] = free.scalars
    assert saxpy.runtime_scalars[a.index].name == "a" and a.dtype is DType.F32
    [(stage, position)] = a.places
    assert saxpy.stages[stage].scalars[position].index == a.index  # type: ignore[union-attr]
    args = [Scalar.u32(8), Scalar.f32(2.5)]
    assert free.changes(args) == [(stage, position, Scalar.f32(2.5))]


def test_a_free_scalar_is_left_out_of_the_prepared_key_and_others_are_not() -> None:
    one = key_of([1], [2], [], [Scalar.u32(8), Scalar.f32(1.0)], {1})
    two = key_of([1], [2], [], [Scalar.u32(8), Scalar.f32(-0.0)], {1})
    other_n = key_of([1], [2], [], [Scalar.u32(9), Scalar.f32(1.0)], {1})
    assert one == two != other_n
    assert key_of([1], [2], [], [Scalar.u32(8), Scalar.f32(0.0)]) != key_of(
        [1], [2], [], [Scalar.u32(8), Scalar.f32(-0.0)]
    )


def test_every_value_of_a_free_scalar_runs_with_its_own_value_from_one_prepared_launch() -> None:
    daemon, _ = host_daemon()
    try:
        values = [float(v) for v in range(1, 21)]
        sums, prepared = accumulate(daemon, values)
        assert np.all(sums == np.float32(sum(values)))
        assert prepared == 1
    finally:
        daemon.close()


def test_each_launch_hands_its_values_before_it_runs() -> None:
    backend = RecordingBackend()
    daemon = Daemon(load_catalog(), {0: backend})
    try:
        values = [1.0, 2.0, 2.0, -3.5, 1.0]
        client = daemon.attach("c").id
        session_id = daemon.load_pipeline(client, SAXPY).session_id
        x = daemon.allocate_buffer(client, 4 * N, DType.F32).id
        y = daemon.allocate_buffer(client, 4 * N, DType.F32).id
        for value in values:
            scalars = {"n": Scalar.u32(N), "a": Scalar.f32(value)}
            daemon.launch(client, session_id, [x, y], [y], scalars)
        daemon.wait_launch(client, session_id)
        assert [launch[-1] for launch in backend.launch_scalars] == values
        assert len(daemon.client(client).sessions[session_id].prepared) == 1
    finally:
        daemon.close()


def test_a_backend_whose_prepared_launches_keep_their_values_prepares_each_value() -> None:
    daemon = Daemon(load_catalog(), {0: BakingBackend()})
    try:
        values = [1.0, 2.0, 3.0, 2.0]
        sums, prepared = accumulate(daemon, values)
        assert np.all(sums == np.float32(8.0))
        assert prepared == 3
    finally:
        daemon.close()


def test_a_scalar_that_sizes_the_launch_is_another_prepared_launch() -> None:
    daemon, _ = host_daemon()
    try:
        client = daemon.attach("c").id
        session_id = daemon.load_pipeline(client, SAXPY).session_id
        x = daemon.allocate_buffer(client, 4 * N, DType.F32).id
        y = daemon.allocate_buffer(client, 4 * N, DType.F32).id
        for n in (N, N - 1, N, N - 2):
            scalars = {"n": Scalar.u32(n), "a": Scalar.f32(float(n))}
            daemon.launch(client, session_id, [x, y], [y], scalars)
        daemon.wait_launch(client, session_id)
        assert len(daemon.client(client).sessions[session_id].prepared) == 3
    finally:
        daemon.close()


def test_a_kernel_gets_minus_zero_where_it_is_given_it() -> None:
    backend = RecordingBackend()
    daemon = Daemon(load_catalog(), {0: backend})
    try:
        client = daemon.attach("c").id
        session_id = daemon.load_pipeline(client, SAXPY).session_id
        x = daemon.allocate_buffer(client, 4 * N, DType.F32).id
        y = daemon.allocate_buffer(client, 4 * N, DType.F32).id
        for value in (0.0, -0.0, -0.0, 0.0):
            scalars = {"n": Scalar.u32(N), "a": Scalar.f32(value)}
            daemon.launch(client, session_id, [x, y], [y], scalars)
        daemon.wait_launch(client, session_id)
        signs = [math.copysign(1.0, launch[-1]) for launch in backend.launch_scalars]
        assert signs == [1.0, -1.0, -1.0, 1.0]
    finally:
        daemon.close()
