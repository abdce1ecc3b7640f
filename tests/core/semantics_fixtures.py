"""The executor's test registry and pipeline (``accy.kernel.test.*``), shared by its tests."""

from __future__ import annotations

import dataclasses

from accyd.backends.base import BackendKind, DeviceBuffer
from accyd.catalog.dtypes import DType
from accyd.catalog.expr import Arg, CeilDiv, Const
from accyd.catalog.model import (
    ArtifactFormat,
    BufferRef,
    BufferSpec,
    DerivedGeometry,
    IntermediateSpec,
    KernelEntry,
    Pipeline,
    Registry,
    ScalarSpec,
    Stage,
)


def pipeline_test_entry(
    target: str, argument_count: int, runtime_scalars: int, launch: DerivedGeometry
) -> KernelEntry:
    return KernelEntry(
        target=target,
        version=1,
        format=ArtifactFormat.CUDA_PTX,
        entry_name=target,
        argument_count=argument_count,
        payload=f"// {target}",
        launch=launch,
        runtime_scalar_argument_count=runtime_scalars,
    )


ONE = Const(1)
BY_64 = (CeilDiv(Arg(0), 64), ONE, ONE)
TEST_ENTRIES = (
    pipeline_test_entry("accy.kernel.test.block_scan", 4, 1, DerivedGeometry(BY_64, (64, 1, 1))),
    pipeline_test_entry(
        "accy.kernel.test.sums_scan", 3, 1, DerivedGeometry((ONE, ONE, ONE), (96, 1, 1))
    ),
    pipeline_test_entry("accy.kernel.test.add_base", 3, 1, DerivedGeometry(BY_64, (64, 1, 1))),
)

TEST_PIPELINE = Pipeline(
    target="accy.kernel.test.device_scan",
    version=1,
    operands=(BufferSpec("x", DType.F32, Arg(0)),),
    results=(BufferSpec("y", DType.F32, Arg(0)),),
    runtime_scalars=(ScalarSpec("n", DType.U32),),
    intermediates=(
        IntermediateSpec(DType.F32, CeilDiv(Arg(0), 64)),
        IntermediateSpec(DType.F32, CeilDiv(Arg(0), 64)),
    ),
    stages=(
        Stage(
            "accy.kernel.test.block_scan",
            1,
            (BufferRef.result(0), BufferRef.operand(0), BufferRef.intermediate(0)),
            (Arg(0),),
        ),
        Stage(
            "accy.kernel.test.sums_scan",
            1,
            (BufferRef.intermediate(1), BufferRef.intermediate(0)),
            (CeilDiv(Arg(0), 64),),
        ),
        Stage(
            "accy.kernel.test.add_base",
            1,
            (BufferRef.result(0), BufferRef.intermediate(1)),
            (Arg(0),),
        ),
    ),
)


def example_registry(entries: tuple[KernelEntry, ...] = TEST_ENTRIES) -> Registry:
    return Registry(entries)


def example_binding(object_id: int, byte_size: int = 20000) -> DeviceBuffer:
    return DeviceBuffer(object_id, BackendKind.RECORDING, byte_size)


def with_format(entries: tuple[KernelEntry, ...], fmt: ArtifactFormat) -> tuple[KernelEntry, ...]:
    return tuple(dataclasses.replace(entry, format=fmt) for entry in entries)
