"""Sessions on the recording backend: scalars by name, launch ids, scratch, the launch log."""

from __future__ import annotations

import pytest

from accyd.catalog.dtypes import DType, Scalar
from accyd.catalog.model import ArtifactFormat
from accyd.core.executor import allocate_intermediates, load_pipeline_artifacts
from accyd.core.sessions import Session, SessionKey, order_scalars
from accyd.errors import FailedPrecondition, LaunchArgumentMismatch, NotFound
from accyd.testing import RecordingBackend
from tests.core.semantics_fixtures import TEST_PIPELINE, example_binding, example_registry

PTX = ArtifactFormat.CUDA_PTX


def make_session(backend: RecordingBackend) -> Session:
    registry = example_registry()
    pool = load_pipeline_artifacts(backend, TEST_PIPELINE, registry, PTX)
    key = SessionKey(TEST_PIPELINE.target, 1, PTX, 0)
    return Session("ses_x", key, TEST_PIPELINE, registry, backend, pool, backend.create_stream())


def test_scalars_are_ordered_by_declared_name_and_converted() -> None:
    assert order_scalars(TEST_PIPELINE, {"n": Scalar(DType.U64, 7)}) == (Scalar.u32(7),)


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({}, "runtime_scalars.n"),
        ({"n": Scalar.u32(1), "m": Scalar.u32(1)}, "runtime_scalars.m"),
        ({"n": Scalar.f32(1.0)}, "runtime_scalars.n"),
        ({"n": Scalar(DType.I64, -1)}, "runtime_scalars.n"),
    ],
)
def test_scalar_refusals_name_the_field(given: dict[str, Scalar], field: str) -> None:
    with pytest.raises(LaunchArgumentMismatch) as caught:
        order_scalars(TEST_PIPELINE, given)
    assert caught.value.field == field


def test_launch_ids_are_answered_after_reaping_and_foreign_ones_are_not_found() -> None:
    backend = RecordingBackend()
    session = make_session(backend)
    transient = allocate_intermediates(backend, TEST_PIPELINE, (Scalar.u32(5000),))
    record = session.enqueue(
        [example_binding(901)], [example_binding(902)], (Scalar.u32(5000),), transient
    )
    launch_id = session.launch_id(record.seq)
    assert session.launch_seq(launch_id) == 1
    assert session.launches_in_flight == 1
    assert session.reap(free_scratch=False).launches == 0  # transient scratch: not on this thread
    reaped = session.reap(free_scratch=True)
    assert (reaped.launches, reaped.scratch) == (1, (transient,))
    reaped.close()
    assert session.pending(1) is None
    other = make_session(backend)
    for bad in (other.launch_id(1), session.launch_id(2), "lau_x.1", ""):
        with pytest.raises(NotFound):
            session.launch_seq(bad)


def test_scratch_too_small_is_refused_with_what_to_call() -> None:
    backend = RecordingBackend()
    session = make_session(backend)
    session.scratch = allocate_intermediates(backend, TEST_PIPELINE, (Scalar.u32(64),))
    assert session.scratch_for((Scalar.u32(64),)) is session.scratch
    with pytest.raises(FailedPrecondition, match="AllocateIntermediates"):
        session.scratch_for((Scalar.u32(5000),))


def test_a_failed_check_frees_transient_scratch_and_leaves_no_record() -> None:
    backend = RecordingBackend()
    session = make_session(backend)
    transient = allocate_intermediates(backend, TEST_PIPELINE, (Scalar.u32(5000),))
    with pytest.raises(LaunchArgumentMismatch):
        session.enqueue(
            [example_binding(901, 4)], [example_binding(902)], (Scalar.u32(5000),), transient
        )
    assert transient.closed
    assert session.launches_in_flight == 0
    assert backend.launch_count == 0


def test_close_frees_pool_scratch_and_every_record() -> None:
    backend = RecordingBackend()
    session = make_session(backend)
    session.scratch = allocate_intermediates(backend, TEST_PIPELINE, (Scalar.u32(5000),))
    for _ in range(3):
        session.enqueue([example_binding(901)], [example_binding(902)], (Scalar.u32(5000),), None)
    assert set(backend.launch_streams) == {session.stream.id}
    assert session.drain().launches == 3
    session.close()
    assert backend.live_ids == set()
