"""The pipeline executor: artifact pools, intermediates and launches (docs/executor.md).

Every check runs before any side effect; whatever a call allocates or loads itself it
waits for and frees; with a caller's pool and intermediates it returns once the stages
are enqueued.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from accyd.backends.base import (
    BUFFER_ALIGNMENT,
    ArtifactRequest,
    Backend,
    CompiledArtifact,
    DeviceBuffer,
    LaunchRequest,
    LoadedKernel,
    Stream,
)
from accyd.catalog.dtypes import Scalar
from accyd.catalog.model import (
    ArtifactFormat,
    BufferRole,
    FixedGeometry,
    KernelEntry,
    Pipeline,
    Registry,
)
from accyd.errors import LaunchArgumentMismatch

__all__ = [
    "ArtifactPool",
    "Intermediates",
    "LaunchPlan",
    "PipelineLaunch",
    "PoolEntry",
    "allocate_intermediates",
    "artifact_request",
    "check_intermediates",
    "check_pool",
    "intermediate_byte_sizes",
    "launch_pipeline",
    "load_pipeline_artifacts",
    "plan_launch",
]


@dataclass(frozen=True, slots=True)
class PoolEntry:
    artifact: CompiledArtifact
    loaded: LoadedKernel


class _Owned:
    """Something freed once by ``close()`` (idempotent), also as a context manager."""

    _closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._free()

    def _free(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class ArtifactPool(_Owned):
    """The compiled and loaded kernel of every stage of one pipeline, made once.

    Made only by ``load_pipeline_artifacts``; owned by its caller, who launches
    the chain many times with it. ``close()`` destroys every loaded kernel once
    and frees every compiled one; it waits for nothing, so the caller first makes
    sure no queued launch still uses the kernels.
    """

    def __init__(
        self,
        backend: Backend,
        pipeline: Pipeline,
        format: ArtifactFormat,
        entries: Sequence[PoolEntry],
    ) -> None:
        self.backend = backend
        self.target = pipeline.target
        self.version = pipeline.version
        self.format = format
        self.entries: tuple[PoolEntry, ...] = tuple(entries)

    def _free(self) -> None:
        _destroy_pool_entries(self.backend, self.entries)


class Intermediates(_Owned):
    """The scratch buffers of one pipeline, sized for one set of runtime scalars.

    Made only by ``allocate_intermediates``; owned by its caller, who passes
    ``buffers`` to many launches and calls ``close()`` (idempotent) only after
    the work queued on them has finished.
    """

    def __init__(self, backend: Backend, buffers: Sequence[DeviceBuffer]) -> None:
        self.backend = backend
        self.buffers: tuple[DeviceBuffer, ...] = tuple(buffers)

    @property
    def byte_size(self) -> int:
        return sum(buffer.byte_size for buffer in self.buffers)

    def _free(self) -> None:
        for buffer in self.buffers:
            self.backend.destroy(buffer)


@dataclass(frozen=True, slots=True)
class PipelineLaunch:
    """One launch request."""

    pipeline: Pipeline
    registry: Registry
    format: ArtifactFormat
    operands: Sequence[DeviceBuffer] = ()
    results: Sequence[DeviceBuffer] = ()
    runtime_scalars: Sequence[Scalar] = ()
    intermediates: Sequence[DeviceBuffer] | None = None
    artifacts: ArtifactPool | None = None
    stream: Stream | None = None
    diagnostic_id: str | None = None


@dataclass(frozen=True, slots=True)
class _StagePlan:
    entry: KernelEntry
    scalars: tuple[Scalar, ...]
    geometry: FixedGeometry
    buffers: tuple[tuple[int, int], ...]
    """(group, index) of each bound buffer; groups are operands, results, intermediates."""
    shared_memory_bytes: int = 0


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """What one (pipeline, registry, format, runtime scalars) resolves to, checked once."""

    stages: tuple[_StagePlan, ...]
    operand_sizes: tuple[int, ...]
    result_sizes: tuple[int, ...]
    intermediate_sizes: tuple[int, ...]


_GROUP = {BufferRole.OPERAND: 0, BufferRole.RESULT: 1, BufferRole.INTERMEDIATE: 2}


def artifact_request(entry: KernelEntry, diagnostic_id: str | None = None) -> ArtifactRequest:
    return ArtifactRequest(
        kernel_name=entry.entry_name,
        format=entry.format,
        argument_count=entry.argument_count,
        scalar_argument_count=entry.scalar_argument_count(),
        payload=entry.payload,
        required_dtypes=entry.required_dtypes,
        required_features=entry.required_features,
        origin=entry.origin,
        diagnostic_id=diagnostic_id,
        params=entry.layout(),
        compile_options=entry.compile_options,
        headers=entry.headers,
        images=entry.images,
        arch=entry.arch,
        source_name=entry.source_name,
    )


def _destroy_pool_entries(backend: Backend, entries: Sequence[PoolEntry]) -> None:
    for entry in entries:
        backend.destroy(entry.loaded)
        entry.artifact.close()


def load_pipeline_artifacts(
    backend: Backend, pipeline: Pipeline, registry: Registry, format: ArtifactFormat
) -> ArtifactPool:
    """Compile and load every stage's kernel once, into a pool the caller owns.

    The whole chain is checked against the registry first; a failure part way
    unloads and frees the stages already loaded.
    """
    pipeline.validate(registry, format)
    entries = pipeline.stage_entries(registry, format)
    made: list[PoolEntry] = []
    try:
        for entry in entries:
            artifact = backend.create_artifact(artifact_request(entry))
            try:
                loaded = backend.load_artifact(artifact)
            except BaseException:
                artifact.close()
                raise
            made.append(PoolEntry(artifact, loaded))
    except BaseException:
        _destroy_pool_entries(backend, made)
        raise
    return ArtifactPool(backend, pipeline, format, made)


def intermediate_byte_sizes(pipeline: Pipeline, runtime_scalars: Sequence[Scalar]) -> list[int]:
    """The byte size of each intermediate for these scalars (0 or overflow: InvalidArtifact)."""
    return [spec.byte_size(runtime_scalars) for spec in pipeline.intermediates]


def allocate_intermediates(
    backend: Backend, pipeline: Pipeline, runtime_scalars: Sequence[Scalar]
) -> Intermediates:
    """Allocate each intermediate once, 256-byte aligned (zeroed where its spec says), for
    the caller to reuse.

    The runtime scalars are checked first; a failed allocation frees the
    buffers already made.
    """
    pipeline.validate_runtime_scalars(runtime_scalars)
    sizes = intermediate_byte_sizes(pipeline, runtime_scalars)
    made: list[DeviceBuffer] = []
    try:
        for spec, size in zip(pipeline.intermediates, sizes, strict=True):
            made.append(
                backend.allocate_buffer(
                    size,
                    alignment=BUFFER_ALIGNMENT,
                    dtype=spec.dtype,
                    element_count=spec.element_count(runtime_scalars),
                    zero=spec.zeroed,
                )
            )
    except BaseException:
        for buffer in made:
            backend.destroy(buffer)
        raise
    return Intermediates(backend, made)


def launch_pipeline(
    backend: Backend, request: PipelineLaunch, plan: LaunchPlan | None = None
) -> None:
    """Run a pipeline once: validate everything, then enqueue its stages in order.

    When the call allocated scratch or loaded kernels itself, it waits for the
    stream before freeing them. With both a pool and scratch from the caller it
    returns without waiting, and the caller synchronizes before reusing or
    freeing them. An error after launching starts a best-effort wait, and what
    the call owns is freed even when that wait fails. ``plan`` is what
    ``plan_launch`` returned for the same request, checked already.
    """
    pipeline = request.pipeline
    if plan is None:
        plan = plan_launch(
            pipeline,
            request.registry,
            request.format,
            request.operands,
            request.results,
            request.runtime_scalars,
        )
    pool = request.artifacts
    if pool is not None:
        check_pool(pool, request)

    owned: Intermediates | None = None
    if request.intermediates is not None:
        check_intermediates(request, plan, request.intermediates)
        intermediates: Sequence[DeviceBuffer] = request.intermediates
    else:
        owned = allocate_intermediates(backend, pipeline, request.runtime_scalars)
        intermediates = owned.buffers

    loaded: list[LoadedKernel] = []
    needs_sync = request.intermediates is None or pool is None
    try:
        try:
            groups = (request.operands, request.results, intermediates)
            for index, stage in enumerate(plan.stages):
                _launch_stage(backend, request, index, stage, groups, loaded)
        except BaseException:
            if needs_sync:
                # Best effort: the first error is the one to report.
                with contextlib.suppress(Exception):
                    backend.synchronize(request.stream)
            raise
        if needs_sync:
            backend.synchronize(request.stream)
    finally:
        for kernel in loaded:
            backend.destroy(kernel)
        if owned is not None:
            owned.close()


def plan_launch(
    pipeline: Pipeline,
    registry: Registry,
    format: ArtifactFormat,
    operands: Sequence[DeviceBuffer],
    results: Sequence[DeviceBuffer],
    runtime_scalars: Sequence[Scalar],
) -> LaunchPlan:
    """Every check that needs no backend: chain, counts, scalars, sizes, geometry.

    Nothing is memoized here: a launch planned once is kept, with its buffers and
    scalars, by its session's prepared launches (``core/prepared.py``), the daemon's
    one cache of the same launch again.
    """
    pipeline.validate(registry, format)
    for role, given, specs in (
        ("operands", operands, pipeline.operands),
        ("results", results, pipeline.results),
    ):
        if len(given) != len(specs):
            raise LaunchArgumentMismatch(
                f"{pipeline.target} takes {len(specs)} {role}; got {len(given)}", field=role
            )
    args = tuple(runtime_scalars)
    plan = _resolve(pipeline, registry, format, args)
    for role, given, specs, sizes in (
        ("operand", operands, pipeline.operands, plan.operand_sizes),
        ("result", results, pipeline.results, plan.result_sizes),
    ):
        for index, (buffer, spec, needed) in enumerate(zip(given, specs, sizes, strict=True)):
            if buffer.byte_size < needed:
                spec.check_holds(buffer.byte_size, needed, role, index, pipeline, args)
    return plan


def _resolve(
    pipeline: Pipeline, registry: Registry, format: ArtifactFormat, args: tuple[Scalar, ...]
) -> LaunchPlan:
    pipeline.validate_runtime_scalars(args)
    operand_sizes = tuple(spec.byte_size(args) for spec in pipeline.operands)
    result_sizes = tuple(spec.byte_size(args) for spec in pipeline.results)
    stages = []
    for stage, entry in zip(pipeline.stages, pipeline.stage_entries(registry, format), strict=True):
        scalars = tuple(expr.evaluate(args) for expr in stage.scalars)
        geometry, shared = stage.launch_geometry(entry, scalars, args)
        refs = tuple((_GROUP[ref.role], ref.index) for ref in stage.buffers)
        stages.append(_StagePlan(entry, scalars, geometry, refs, shared))
    return LaunchPlan(
        tuple(stages), operand_sizes, result_sizes, tuple(intermediate_byte_sizes(pipeline, args))
    )


def check_pool(pool: ArtifactPool, request: PipelineLaunch) -> None:
    pipeline = request.pipeline
    if pool.closed:
        raise LaunchArgumentMismatch("the artifact pool is closed", field="artifacts")
    mismatches = [
        (len(pool.entries), len(pipeline.stages), "stage count"),
        (pool.version, pipeline.version, "version"),
        (pool.format, request.format, "format"),
        (pool.target, pipeline.target, "target"),
    ]
    for have, want, what in mismatches:
        if have != want:
            raise LaunchArgumentMismatch(
                f"the artifact pool's {what} is {have}; the launch needs {want}", field="artifacts"
            )


def check_intermediates(
    request: PipelineLaunch, plan: LaunchPlan, provided: Sequence[DeviceBuffer]
) -> None:
    pipeline = request.pipeline
    if len(provided) != len(pipeline.intermediates):
        raise LaunchArgumentMismatch(
            f"{pipeline.target} needs {len(pipeline.intermediates)} intermediates; "
            f"got {len(provided)}",
            field="intermediates",
        )
    for index, (buffer, size) in enumerate(zip(provided, plan.intermediate_sizes, strict=True)):
        if buffer.byte_size < size:
            raise LaunchArgumentMismatch(
                f"intermediate {index} holds {buffer.byte_size} bytes; these runtime scalars "
                f"need {size}",
                field=f"intermediates[{index}]",
            )
        others = (*provided[:index], *request.operands, *request.results)
        if any(buffer.aliases(other) for other in others):
            raise LaunchArgumentMismatch(
                f"intermediate {index} aliases another scratch, operand or result buffer",
                field=f"intermediates[{index}]",
            )


def _launch_stage(
    backend: Backend,
    request: PipelineLaunch,
    index: int,
    plan: _StagePlan,
    groups: tuple[Sequence[DeviceBuffer], ...],
    loaded: list[LoadedKernel],
) -> None:
    buffers = [groups[group][index] for group, index in plan.buffers]

    def launch(artifact: CompiledArtifact, kernel: LoadedKernel) -> None:
        backend.launch(
            LaunchRequest(
                artifact=artifact,
                loaded=kernel,
                buffers=buffers,
                scalars=plan.scalars,
                geometry=plan.geometry,
                stream=request.stream,
                shared_memory_bytes=plan.shared_memory_bytes,
                diagnostic_id=request.diagnostic_id,
            )
        )

    if request.artifacts is not None:
        pool_entry = request.artifacts.entries[index]
        launch(pool_entry.artifact, pool_entry.loaded)
        return

    artifact = backend.create_artifact(artifact_request(plan.entry, request.diagnostic_id))
    try:
        kernel = backend.load_artifact(artifact)
        try:
            launch(artifact, kernel)
        except BaseException:
            backend.destroy(kernel)
            raise
        loaded.append(kernel)
    finally:
        artifact.close()
