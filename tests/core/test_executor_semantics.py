"""The executor's rules (docs/executor.md), each a test on the recording backend."""

from __future__ import annotations

import dataclasses

import pytest

from accyd.catalog.dtypes import Scalar
from accyd.catalog.model import ArtifactFormat, ScalarBound
from accyd.core.executor import (
    PipelineLaunch,
    allocate_intermediates,
    launch_pipeline,
    load_pipeline_artifacts,
)
from accyd.errors import (
    InvalidArtifact,
    LaunchArgumentMismatch,
    OutOfMemory,
    RuntimeUnavailable,
)
from accyd.testing import RecordingBackend
from tests.core.semantics_fixtures import (
    TEST_ENTRIES,
    TEST_PIPELINE,
    example_binding,
    example_registry,
    with_format,
)

PTX = ArtifactFormat.CUDA_PTX
ARGS = (Scalar.u32(5000),)
OPERANDS = (example_binding(1001),)
RESULTS = (example_binding(1002),)


def request(**overrides: object) -> PipelineLaunch:
    fields: dict[str, object] = {
        "pipeline": TEST_PIPELINE,
        "registry": example_registry(),
        "format": PTX,
        "operands": OPERANDS,
        "results": RESULTS,
        "runtime_scalars": ARGS,
    }
    fields.update(overrides)
    return PipelineLaunch(**fields)  # type: ignore[arg-type]


def test_a_zeroed_intermediate_is_zeros_when_made_and_the_rest_are_not() -> None:
    """Rule 2: zeroed is asked of the backend at allocation, for that intermediate alone,
    for a launch's own scratch and for a session's kept one."""
    first, second = TEST_PIPELINE.intermediates
    zeroed = dataclasses.replace(
        TEST_PIPELINE, intermediates=(dataclasses.replace(first, zeroed=True), second)
    )
    state = RecordingBackend()
    launch_pipeline(state, request(pipeline=zeroed))
    with allocate_intermediates(state, zeroed, ARGS):
        pass
    launch_pipeline(state, request())
    assert state.allocated_buffer_zeroed == [True, False, True, False, False, False]
    assert state.live_ids == set()


def test_derives_intermediates_scalars_and_geometry_per_stage() -> None:
    state = RecordingBackend()
    launch_pipeline(state, request())

    assert state.buffer_allocate_count == 2
    assert state.allocated_buffer_byte_sizes[:2] == [79 * 4, 79 * 4]
    assert state.allocated_buffer_alignments == [256, 256]

    assert state.launch_count == 3
    assert state.launch_grids == [(79, 1, 1), (1, 1, 1), (79, 1, 1)]
    assert state.launch_scalar_u32s == [5000, 79, 5000]

    assert state.last_launch_buffer_count == 2
    assert state.last_buffer_ids[0] == 1002
    assert state.load_count == 3
    assert state.destroy_count == 5
    assert state.allocated_buffer_ids[0] in state.destroyed_ids
    assert state.allocated_buffer_ids[1] in state.destroyed_ids
    assert state.live_ids == set()
    assert state.synchronize_count == 1


def test_rejects_binding_count_mismatches() -> None:
    state = RecordingBackend()
    with pytest.raises(LaunchArgumentMismatch):
        launch_pipeline(state, request(operands=()))
    with pytest.raises(LaunchArgumentMismatch):
        launch_pipeline(state, request(runtime_scalars=()))
    assert state.launch_count == 0


def test_rejects_runtime_scalar_bounds_before_allocation() -> None:
    state = RecordingBackend()
    bounded = dataclasses.replace(TEST_PIPELINE, runtime_scalar_bounds=(ScalarBound(0, 5000),))
    args = (Scalar.u32(5001),)

    with pytest.raises(LaunchArgumentMismatch):
        launch_pipeline(state, request(pipeline=bounded, runtime_scalars=args))
    assert state.buffer_allocate_count == 0
    assert state.launch_count == 0

    with pytest.raises(LaunchArgumentMismatch):
        allocate_intermediates(state, bounded, args)
    assert state.buffer_allocate_count == 0


def test_refuses_unresolvable_stages_before_any_launch() -> None:
    state = RecordingBackend()
    with pytest.raises(InvalidArtifact):
        launch_pipeline(state, request(registry=example_registry(TEST_ENTRIES[:1])))
    assert state.launch_count == 0
    assert state.destroy_count == 0


def test_releases_intermediates_after_partial_allocation_failure() -> None:
    state = RecordingBackend(fail_buffer_allocate_after_count=1)
    with pytest.raises(OutOfMemory):
        launch_pipeline(state, request())
    assert state.buffer_allocate_count == 1
    assert state.destroy_count == 1
    assert state.allocated_buffer_ids[0] in state.destroyed_ids


def test_releases_loaded_artifacts_after_staged_load_failure() -> None:
    state = RecordingBackend(fail_load_after_count=1)
    with pytest.raises(RuntimeUnavailable):
        launch_pipeline(state, request())
    assert state.buffer_allocate_count == 2
    assert state.load_count == 1
    assert state.launch_count == 1
    assert state.destroy_count == 3
    assert state.allocated_buffer_ids[0] in state.destroyed_ids
    assert state.allocated_buffer_ids[1] in state.destroyed_ids
    # An error after launching waits (best effort) before freeing.
    assert state.synchronize_count == 1
    assert state.live_ids == set()


def test_reuses_provided_intermediates_without_allocating() -> None:
    state = RecordingBackend()
    with allocate_intermediates(state, TEST_PIPELINE, ARGS) as provided:
        assert state.buffer_allocate_count == 2

        launch_pipeline(state, request(intermediates=provided.buffers))
        assert state.buffer_allocate_count == 2
        assert state.launch_count == 3

        launch_pipeline(state, request(intermediates=provided.buffers))
        assert state.buffer_allocate_count == 2
        assert state.launch_count == 6
    assert state.live_ids == set()


def test_rejects_undersized_or_miscounted_provided_intermediates() -> None:
    state = RecordingBackend()

    miscounted = (example_binding(2001),)
    with pytest.raises(LaunchArgumentMismatch):
        launch_pipeline(state, request(intermediates=miscounted))

    undersized = (example_binding(2001), example_binding(2002, byte_size=4))
    with pytest.raises(LaunchArgumentMismatch):
        launch_pipeline(state, request(intermediates=undersized))

    duplicate = (example_binding(2001), example_binding(2001))
    with pytest.raises(LaunchArgumentMismatch):
        launch_pipeline(state, request(intermediates=duplicate))

    operand_alias = (OPERANDS[0], example_binding(2002))
    with pytest.raises(LaunchArgumentMismatch):
        launch_pipeline(state, request(intermediates=operand_alias))

    result_alias = (example_binding(2001), RESULTS[0])
    with pytest.raises(LaunchArgumentMismatch):
        launch_pipeline(state, request(intermediates=result_alias))
    assert state.launch_count == 0


def test_launches_from_a_loaded_artifact_pool_without_driver_round_trips() -> None:
    state = RecordingBackend()
    registry = example_registry()
    with load_pipeline_artifacts(state, TEST_PIPELINE, registry, PTX) as pool:
        assert state.create_count == 3
        assert state.load_count == 3

        with allocate_intermediates(state, TEST_PIPELINE, ARGS) as provided:
            for _ in range(3):
                launch_pipeline(
                    state,
                    request(registry=registry, intermediates=provided.buffers, artifacts=pool),
                )
    assert state.create_count == 3
    assert state.load_count == 3
    assert state.launch_count == 9
    # With both a pool and scratch from the caller, the launch does not wait.
    assert state.synchronize_count == 0


def test_pool_close_destroys_loaded_artifacts() -> None:
    state = RecordingBackend()
    pool = load_pipeline_artifacts(state, TEST_PIPELINE, example_registry(), PTX)
    assert state.load_count == 3
    assert state.destroy_count == 0

    pool.close()
    assert state.destroy_count == 3
    assert state.last_destroyed_id == 3
    assert all(entry.artifact.closed for entry in pool.entries)

    pool.close()  # idempotent: each kernel is destroyed once
    assert state.destroy_count == 3


def test_stage_artifacts_carry_their_entrys_scalar_count() -> None:
    state = RecordingBackend()
    registry = example_registry()
    with load_pipeline_artifacts(state, TEST_PIPELINE, registry, PTX) as pool:
        for pool_entry, stage in zip(pool.entries, TEST_PIPELINE.stages, strict=True):
            entry = registry.find(stage.target, stage.version, PTX)
            assert entry is not None
            assert pool_entry.artifact.scalar_argument_count == entry.runtime_scalar_argument_count
            assert pool_entry.artifact.buffer_argument_count() == (
                entry.argument_count - entry.runtime_scalar_argument_count
            )


def test_pool_cleans_loaded_artifacts_after_staged_load_failure() -> None:
    state = RecordingBackend(fail_load_after_count=1)
    with pytest.raises(RuntimeUnavailable):
        load_pipeline_artifacts(state, TEST_PIPELINE, example_registry(), PTX)
    assert state.load_count == 1
    assert state.destroy_count == 1
    assert state.last_destroyed_id == 1


def test_rejects_mismatched_artifact_pools_before_any_launch() -> None:
    state = RecordingBackend()
    registry = example_registry()
    with load_pipeline_artifacts(state, TEST_PIPELINE, registry, PTX) as pool:
        renamed = dataclasses.replace(TEST_PIPELINE, target="accy.kernel.test.other_pipeline")
        with pytest.raises(LaunchArgumentMismatch):
            launch_pipeline(state, request(pipeline=renamed, registry=registry, artifacts=pool))

        reversioned = dataclasses.replace(TEST_PIPELINE, version=9)
        with pytest.raises(LaunchArgumentMismatch):
            launch_pipeline(state, request(pipeline=reversioned, registry=registry, artifacts=pool))
    assert state.launch_count == 0


def test_rejects_artifact_pool_format_mismatches_before_any_launch() -> None:
    state = RecordingBackend()
    registry = example_registry()
    metal_registry = example_registry(with_format(TEST_ENTRIES, ArtifactFormat.METAL_MSL))
    with (
        load_pipeline_artifacts(state, TEST_PIPELINE, registry, PTX) as pool,
        pytest.raises(LaunchArgumentMismatch),
    ):
        launch_pipeline(
            state,
            request(registry=metal_registry, format=ArtifactFormat.METAL_MSL, artifacts=pool),
        )
    assert state.buffer_allocate_count == 0
    assert state.launch_count == 0
