"""Bad launches raise typed errors before anything is allocated, loaded or launched."""

from __future__ import annotations

import dataclasses

import pytest

from accyd.catalog import Scalar, load_catalog
from accyd.catalog.dtypes import DType
from accyd.catalog.expr import Arg, Const, Mul
from accyd.catalog.model import (
    ArtifactFormat,
    BufferSpec,
    DerivedGeometry,
    IntermediateSpec,
    ScalarSpec,
    Stage,
)
from accyd.core.executor import PipelineLaunch, allocate_intermediates, launch_pipeline
from accyd.errors import AccyError, InvalidArtifact, LaunchArgumentMismatch
from accyd.testing import RecordingBackend
from tests.core.semantics_fixtures import (
    TEST_ENTRIES,
    TEST_PIPELINE,
    example_binding,
    example_registry,
)

CATALOG = load_catalog()
HOST = ArtifactFormat.HOST_PY
SCAN = CATALOG.find_pipeline("accy.kernel.device_scan")
SAXPY = CATALOG.find_pipeline("accy.kernel.saxpy")


def buffers(*sizes: int) -> list:  # type: ignore[type-arg]
    return [example_binding(9000 + i, size) for i, size in enumerate(sizes)]


def refused(
    state: RecordingBackend, error: type[AccyError], request: PipelineLaunch, match: str
) -> None:
    with pytest.raises(error, match=match):
        launch_pipeline(state, request)
    assert state.buffer_allocate_count == 0
    assert state.create_count == 0
    assert state.load_count == 0
    assert state.launch_count == 0
    assert state.live_ids == set()


def scan_launch(n: int, x: int, y: int, **overrides: object) -> PipelineLaunch:
    operand, result = buffers(x, y)
    fields: dict[str, object] = {
        "pipeline": SCAN,
        "registry": CATALOG.registry,
        "format": HOST,
        "operands": [operand],
        "results": [result],
        "runtime_scalars": [Scalar.u32(n)],
    }
    fields.update(overrides)
    return PipelineLaunch(**fields)  # type: ignore[arg-type]


def test_a_good_launch_passes_so_the_refusals_below_mean_something() -> None:
    state = RecordingBackend()
    launch_pipeline(state, scan_launch(10000, 40000, 40000))
    assert state.launch_count == 1
    assert state.allocated_buffer_byte_sizes == [3 * 8, 4 * 4]  # state and partials, 2 tiles
    assert state.allocated_buffer_zeroed == [True, False]  # as the manifest says
    assert state.live_ids == set()


@pytest.mark.parametrize(
    ("request_", "error", "match"),
    [
        (
            scan_launch(5000, 19996, 20000),
            LaunchArgumentMismatch,
            r"operand 'x' holds 19996 bytes; .* need 20000",
        ),
        (scan_launch(5000, 20000, 4), LaunchArgumentMismatch, r"result 'y' holds 4 bytes"),
        (
            scan_launch(2**30 + 1, 2**33, 2**33),
            LaunchArgumentMismatch,
            r"'n' is 1073741825; .* accepts 1..1073741824",
        ),
        (scan_launch(0, 4, 4), LaunchArgumentMismatch, r"'n' is 0"),
        (
            scan_launch(5000, 20000, 20000, operands=[]),
            LaunchArgumentMismatch,
            "takes 1 operands; got 0",
        ),
        (
            scan_launch(5000, 20000, 20000, results=buffers(4, 4)),
            LaunchArgumentMismatch,
            "takes 1 results; got 2",
        ),
        (
            scan_launch(5000, 20000, 20000, runtime_scalars=[Scalar.f32(5000.0)]),
            LaunchArgumentMismatch,
            "'n' is u32; got f32",
        ),
        (
            scan_launch(5000, 20000, 20000, runtime_scalars=[Scalar.u32(1), Scalar.u32(2)]),
            LaunchArgumentMismatch,
            "takes 1 runtime scalars",
        ),
        (
            scan_launch(5000, 20000, 20000, registry=example_registry(TEST_ENTRIES)),
            InvalidArtifact,
            r"stage 0 \(accy.kernel.scan.single_pass v1\) has no host_py entry",
        ),
        (
            scan_launch(
                5000,
                20000,
                20000,
                format=ArtifactFormat.CUDA_CUBIN,
                registry=example_registry(TEST_ENTRIES),
            ),
            InvalidArtifact,
            "no cuda_cubin entry",
        ),
    ],
)
def test_bad_launches_are_refused_before_any_side_effect(
    request_: PipelineLaunch, error: type[AccyError], match: str
) -> None:
    refused(RecordingBackend(), error, request_, match)


def test_scratch_that_aliases_or_is_too_small_is_refused() -> None:
    state = RecordingBackend()
    operand, result = buffers(40000, 40000)
    good = example_binding(1, 8 * 3), example_binding(2, 4 * 4)  # state and partials, 2 tiles
    base = scan_launch(10000, 40000, 40000, operands=[operand], results=[result])
    for scratch, match in [
        ((good[0], good[0]), "aliases another scratch"),
        ((operand, good[1]), "aliases another scratch, operand or result"),
        ((good[0], result), "aliases"),
        ((example_binding(1, 16), good[1]), "intermediate 0 holds 16 bytes; .* need 24"),
        ((good[0],), "needs 2 intermediates; got 1"),
    ]:
        refused(
            state, LaunchArgumentMismatch, dataclasses.replace(base, intermediates=scratch), match
        )


def test_operand_and_result_may_be_the_same_buffer_for_in_place_updates() -> None:
    state = RecordingBackend()
    x, y = buffers(400, 400)
    launch_pipeline(
        state,
        PipelineLaunch(
            SAXPY, CATALOG.registry, HOST, [x, y], [y], [Scalar.u32(100), Scalar.f32(2.0)]
        ),
    )
    assert state.launch_buffer_ids == [(y.id, x.id, y.id)]
    assert state.launch_scalars == [(100, 2.0)]


def test_zero_extent_is_invalid_artifact_before_allocation() -> None:
    state = RecordingBackend()
    request = PipelineLaunch(
        TEST_PIPELINE,
        example_registry(),
        ArtifactFormat.CUDA_PTX,
        buffers(4),
        buffers(4),
        [Scalar.u32(0)],
    )
    refused(state, InvalidArtifact, request, "extent scalar 0 is 0")
    with pytest.raises(InvalidArtifact, match="is 0"):
        allocate_intermediates(state, TEST_PIPELINE, [Scalar.u32(0)])
    assert state.buffer_allocate_count == 0


def test_overflowing_extent_is_invalid_artifact_before_allocation() -> None:
    state = RecordingBackend()
    cube = Mul(Mul(Arg(0), Arg(0)), Arg(0))
    huge = dataclasses.replace(
        TEST_PIPELINE,
        intermediates=(IntermediateSpec(DType.F64, cube), TEST_PIPELINE.intermediates[1]),
    )
    args = [Scalar.u32(2**32 - 1)]
    with pytest.raises(InvalidArtifact, match="overflows"):
        allocate_intermediates(state, huge, args)
    big = example_binding(5, 2**40)
    refused(
        state,
        InvalidArtifact,
        PipelineLaunch(
            huge,
            example_registry(),
            ArtifactFormat.CUDA_PTX,
            [big],
            [example_binding(6, 2**40)],
            args,
        ),
        "overflows",
    )


def test_derived_scalar_past_u32_is_invalid_artifact_before_allocation() -> None:
    state = RecordingBackend()
    squared = dataclasses.replace(
        TEST_PIPELINE,
        stages=(
            dataclasses.replace(TEST_PIPELINE.stages[0], scalars=(Mul(Arg(0), Arg(0)),)),
            *TEST_PIPELINE.stages[1:],
        ),
    )
    request = PipelineLaunch(
        squared,
        example_registry(),
        ArtifactFormat.CUDA_PTX,
        buffers(2**40),
        buffers(2**40),
        [Scalar.u32(2**17)],
    )
    refused(state, InvalidArtifact, request, "overflows u32")


def test_grid_past_the_device_limit_is_refused_before_allocation() -> None:
    state = RecordingBackend()
    tall = dataclasses.replace(
        TEST_ENTRIES[1], launch=DerivedGeometry((Const(1), Arg(0), Const(1)), (96, 1, 1))
    )
    registry = example_registry((TEST_ENTRIES[0], tall, TEST_ENTRIES[2]))
    request = PipelineLaunch(
        TEST_PIPELINE,
        registry,
        ArtifactFormat.CUDA_PTX,
        buffers(2**25),
        buffers(2**25),
        [Scalar.u32(64 * 70000)],
    )
    refused(
        state, LaunchArgumentMismatch, request, r"grid dimension 1 is 70000; it must be 1..65535"
    )


def test_scalar_types_are_checked_when_made() -> None:
    with pytest.raises(LaunchArgumentMismatch, match="does not fit u32"):
        Scalar.u32(-1)
    with pytest.raises(LaunchArgumentMismatch, match="does not fit u32"):
        Scalar.u32(2**32)
    with pytest.raises(LaunchArgumentMismatch, match="must be finite"):
        Scalar.f32(float("nan"))
    with pytest.raises(LaunchArgumentMismatch, match="expected an integer"):
        Scalar.u32(1.5)  # type: ignore[arg-type]
    assert Scalar.u32(7).to_bytes() == (7).to_bytes(4, "little")


def test_pipeline_with_unknown_runtime_scalar_index_is_invalid() -> None:
    broken = dataclasses.replace(
        TEST_PIPELINE,
        operands=(BufferSpec("x", DType.F32, Arg(3)),),
        runtime_scalars=(ScalarSpec("n"),),
    )
    with pytest.raises(InvalidArtifact, match="names a runtime scalar past the 1 declared"):
        broken.validate(example_registry(), ArtifactFormat.CUDA_PTX)
    stageless = dataclasses.replace(TEST_PIPELINE, stages=())
    with pytest.raises(InvalidArtifact, match="has no stages"):
        stageless.validate(example_registry(), ArtifactFormat.CUDA_PTX)
    bad_ref = dataclasses.replace(
        TEST_PIPELINE,
        stages=(
            Stage(
                "accy.kernel.test.sums_scan",
                1,
                (TEST_PIPELINE.stages[0].buffers[2],) * 2,
                (Arg(0),),
            ),
        ),
        intermediates=(),
    )
    with pytest.raises(InvalidArtifact, match="names intermediate 0, but there are 0"):
        bad_ref.validate(example_registry(), ArtifactFormat.CUDA_PTX)
