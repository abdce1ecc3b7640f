"""The catalog's data model: pipelines, their buffers, scalars and stages, and their validation
(registry entries are in ``entries``, re-exported here).

Pure data and checks: no driver, no grpc. Names follow the executor's vocabulary
(docs/executor.md); every check raises a domain error before anything is allocated
or launched.
"""

from __future__ import annotations

import enum
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

from accyd.catalog.dtypes import DType, Scalar
from accyd.catalog.entries import (
    ArtifactFormat,
    DerivedGeometry,
    Dim3,
    FixedGeometry,
    Geometry,
    KernelEntry,
    Param,
    ParamKind,
    Registry,
    check_geometry,
)
from accyd.catalog.expr import Arg, Binary, Expr, extent_of, render
from accyd.errors import InvalidArtifact, LaunchArgumentMismatch

__all__ = [
    "MAX_BYTE_SIZE",
    "ArtifactFormat",
    "BufferRef",
    "BufferRole",
    "BufferSpec",
    "DerivedGeometry",
    "FixedGeometry",
    "Geometry",
    "IntermediateSpec",
    "KernelEntry",
    "Param",
    "ParamKind",
    "Pipeline",
    "Registry",
    "ScalarBound",
    "ScalarSpec",
    "Stage",
    "StageGeometry",
]

MAX_BYTE_SIZE = 2**63 - 1
"""The largest byte size any buffer may have; an extent past it is an overflow."""


class BufferRole(enum.Enum):
    OPERAND = "operand"
    RESULT = "result"
    INTERMEDIATE = "intermediate"


@dataclass(frozen=True, slots=True)
class BufferRef:
    """A stage's reference to one of the pipeline's buffers."""

    role: BufferRole
    index: int

    @classmethod
    def operand(cls, index: int) -> BufferRef:
        return cls(BufferRole.OPERAND, index)

    @classmethod
    def result(cls, index: int) -> BufferRef:
        return cls(BufferRole.RESULT, index)

    @classmethod
    def intermediate(cls, index: int) -> BufferRef:
        return cls(BufferRole.INTERMEDIATE, index)


def _arg_indices(expr: Expr) -> list[int]:
    """The runtime scalars an expression names, each once, in order of appearance."""
    if isinstance(expr, Arg):
        return [expr.index]
    if isinstance(expr, Binary):
        return list(dict.fromkeys(_arg_indices(expr.left) + _arg_indices(expr.right)))
    return []


@dataclass(frozen=True, slots=True)
class BufferSpec:
    """An operand or result: its name, dtype and the fewest elements it must hold."""

    name: str
    dtype: DType
    extent: Expr
    shape: tuple[Expr, ...] = ()
    """The tensor's dims over the runtime scalars (``extent`` is their product); empty for a
    flat buffer."""

    def byte_size(self, args: Sequence[Scalar]) -> int:
        return _byte_size(self.extent, self.dtype, args, f"{self.name}")

    def dims(self, args: Sequence[Scalar]) -> tuple[int, ...]:
        """The tensor's dims for these runtime scalars (``(extent,)`` when flat)."""
        return tuple(extent_of(dim, args) for dim in self.shape or (self.extent,))

    def check_holds(
        self,
        have: int,
        needed: int,
        role: str,
        index: int,
        pipeline: Pipeline | None = None,
        args: Sequence[Scalar] = (),
    ) -> None:
        """Refuse ``have`` bytes where the runtime scalars need ``needed`` bytes.

        Given the pipeline and the runtime scalars, the message names the
        scalars the extent is made of, with their values.
        """
        if have >= needed:
            return
        names = [spec.name for spec in pipeline.runtime_scalars] if pipeline is not None else []
        extent = render(self.extent, names)
        used = _arg_indices(self.extent)
        values = "".join(f", {names[i]} = {args[i].value}" for i in used if i < len(args))
        raise LaunchArgumentMismatch(
            f"{role} {self.name!r} holds {have} bytes; these runtime scalars need {needed} "
            f"({extent} x {self.dtype.value}{values})",
            field=f"{role}s[{index}]",
        )


@dataclass(frozen=True, slots=True)
class IntermediateSpec:
    """A scratch buffer between stages, sized from the runtime scalars.

    ``zeroed``: filled with zeros when allocated, and never again: for a kernel that
    keeps state in it from one launch to the next (scratch is one session's, whose
    launches run in order on its stream).
    """

    dtype: DType
    extent: Expr
    name: str = ""
    zeroed: bool = False

    def element_count(self, args: Sequence[Scalar]) -> int:
        return extent_of(self.extent, args)

    def byte_size(self, args: Sequence[Scalar]) -> int:
        return _byte_size(self.extent, self.dtype, args, self.name or "intermediate")


def _byte_size(extent: Expr, dtype: DType, args: Sequence[Scalar], what: str) -> int:
    count = extent_of(extent, args)
    if count == 0:
        raise InvalidArtifact(f"{what}: extent {extent} is 0 for these runtime scalars")
    size = count * dtype.itemsize
    if size > MAX_BYTE_SIZE:
        raise InvalidArtifact(f"{what}: extent {extent} = {count} elements overflows")
    return size


@dataclass(frozen=True, slots=True)
class ScalarSpec:
    """A runtime scalar the caller passes: its name and dtype."""

    name: str
    dtype: DType = DType.U32


@dataclass(frozen=True, slots=True)
class ScalarBound:
    """The largest (and optionally smallest) value a runtime scalar may take."""

    argument_index: int
    max_value: int | float
    min_value: int | float | None = None


@dataclass(frozen=True, slots=True)
class StageGeometry:
    """A stage's own grid, block and dynamic shared memory, over the pipeline's runtime
    scalars (a row softmax's grid is its rows, which its kernel never takes); each part
    left ``None`` keeps the kernel's."""

    grid: tuple[Expr, Expr, Expr] | None = None
    block: tuple[Expr, Expr, Expr] | None = None
    shared_memory_bytes: Expr | None = None

    def exprs(self) -> list[Expr]:
        found: list[Expr] = [*(self.grid or ()), *(self.block or ())]
        return found + ([self.shared_memory_bytes] if self.shared_memory_bytes else [])


@dataclass(frozen=True, slots=True)
class Stage:
    """One kernel launch of a pipeline: which entry, which buffers, which scalars."""

    target: str
    version: int
    buffers: tuple[BufferRef, ...]
    scalars: tuple[Expr, ...]
    geometry: StageGeometry | None = None

    def launch_geometry(
        self, entry: KernelEntry, scalars: Sequence[Scalar], args: Sequence[Scalar]
    ) -> tuple[FixedGeometry, int]:
        """The grid, block and dynamic shared memory of one launch: the kernel's rule over
        the stage's ``scalars``, with this stage's own parts over the runtime ``args``."""
        geometry = entry.launch.resolve(scalars)
        shared = entry.shared_memory_bytes
        own = self.geometry
        if own is not None:
            grid, block = geometry.grid, geometry.block
            if own.grid is not None:
                grid = _dim3(own.grid, args)
            if own.block is not None:
                block = _dim3(own.block, args)
            geometry = FixedGeometry(grid, block)
            if own.shared_memory_bytes is not None:
                shared = extent_of(own.shared_memory_bytes, args)
        check_geometry(geometry)
        if shared > MAX_SHARED_MEMORY:
            raise LaunchArgumentMismatch(
                f"{self.target}: {shared} bytes of dynamic shared memory; at most "
                f"{MAX_SHARED_MEMORY}",
                field="runtime_scalars",
            )
        return geometry, shared


MAX_SHARED_MEMORY = 2**20
"""Dynamic shared memory past any device's (the driver then refuses the exact amount)."""


def _dim3(exprs: tuple[Expr, Expr, Expr], args: Sequence[Scalar]) -> Dim3:
    x, y, z = (extent_of(e, args) for e in exprs)
    return (x, y, z)


@dataclass(frozen=True, slots=True)
class Pipeline:
    """A chain of kernel stages run as one launch (docs/executor.md)."""

    target: str
    version: int
    operands: tuple[BufferSpec, ...]
    results: tuple[BufferSpec, ...]
    runtime_scalars: tuple[ScalarSpec, ...]
    stages: tuple[Stage, ...]
    intermediates: tuple[IntermediateSpec, ...] = ()
    runtime_scalar_bounds: tuple[ScalarBound, ...] = ()
    description: str = ""
    origin: str = "<memory>"
    _validated: weakref.WeakKeyDictionary[Registry, set[ArtifactFormat]] = field(
        default_factory=weakref.WeakKeyDictionary, init=False, compare=False, repr=False
    )

    @property
    def operand_count(self) -> int:
        return len(self.operands)

    @property
    def result_count(self) -> int:
        return len(self.results)

    @property
    def runtime_scalar_argument_count(self) -> int:
        return len(self.runtime_scalars)

    def stage_entries(self, registry: Registry, format: ArtifactFormat) -> list[KernelEntry]:
        """The registry entry of each stage; an unresolvable stage is ``InvalidArtifact``."""
        entries = []
        for index, stage in enumerate(self.stages):
            entry = registry.find(stage.target, stage.version, format)
            if entry is None:
                raise InvalidArtifact(
                    f"pipeline {self.target} v{self.version}: stage {index} "
                    f"({stage.target} v{stage.version}) has no {format.value} entry in the registry"
                )
            entries.append(entry)
        return entries

    def free_scalars(self, registry: Registry, format: ArtifactFormat) -> frozenset[int]:
        """The runtime scalars (by index) whose values no check reads beyond their dtype's.

        A scalar is free when it has no bounds; no extent, shape or stage geometry names it;
        and it reaches the kernels only as a stage's plain scalar argument (``Arg``) that
        the kernel's launch rule does not read. Such a value changes nothing the core
        decides about a launch: its buffers, scratch, grid and hazards are the same. That is
        what lets a checked launch be replayed with another value of it (its ticket's key
        would leave it out). Its dtype's own check still applies: every integer of its
        width fits, but a float must be finite.
        """
        read: set[int] = {bound.argument_index for bound in self.runtime_scalar_bounds}
        for spec in (*self.operands, *self.results):
            for expr in (spec.extent, *spec.shape):
                read.update(_arg_indices(expr))
        for intermediate in self.intermediates:
            read.update(_arg_indices(intermediate.extent))
        for stage, entry in zip(self.stages, self.stage_entries(registry, format), strict=True):
            for expr in stage.geometry.exprs() if stage.geometry is not None else ():
                read.update(_arg_indices(expr))
            rule = entry.launch
            by_rule: set[int] = set()
            if isinstance(rule, DerivedGeometry):
                for dim in rule.grid:
                    by_rule.update(_arg_indices(dim))
            for position, expr in enumerate(stage.scalars):
                if isinstance(expr, Arg) and position not in by_rule:
                    continue  # passed through as it is
                read.update(_arg_indices(expr))
        return frozenset(set(range(len(self.runtime_scalars))) - read)

    def validate(self, registry: Registry, format: ArtifactFormat) -> None:
        """Check the whole chain against the registry; cached per (registry, format)."""
        if format in self._validated.get(registry, ()):
            return
        self._validate_shape()
        arg_dtypes = [spec.dtype for spec in self.runtime_scalars]
        for index, (stage, entry) in enumerate(
            zip(self.stages, self.stage_entries(registry, format), strict=True)
        ):
            where = f"pipeline {self.target} v{self.version}: stage {index} ({stage.target})"
            if entry.buffer_argument_count() != len(stage.buffers):
                raise InvalidArtifact(
                    f"{where} binds {len(stage.buffers)} buffers; "
                    f"the kernel takes {entry.buffer_argument_count()}"
                )
            if entry.scalar_argument_count() != len(stage.scalars):
                raise InvalidArtifact(
                    f"{where} passes {len(stage.scalars)} scalars; "
                    f"the kernel takes {entry.scalar_argument_count()}"
                )
            for own in stage.geometry.exprs() if stage.geometry is not None else ():
                if not own.result_dtype(arg_dtypes).is_integer:
                    raise InvalidArtifact(f"{where}: geometry {own} needs integer scalars")
            derived = tuple(expr.result_dtype(arg_dtypes) for expr in stage.scalars)
            if derived != entry.expected_scalar_dtypes():
                raise InvalidArtifact(
                    f"{where} passes scalars of types {[d.value for d in derived]}; the kernel "
                    f"takes {[d.value for d in entry.expected_scalar_dtypes()]}"
                )
        self._validated.setdefault(registry, set()).add(format)

    def _validate_shape(self) -> None:
        name = f"pipeline {self.target} v{self.version}"
        if not self.stages:
            raise InvalidArtifact(f"{name} has no stages")
        counts = {
            BufferRole.OPERAND: self.operand_count,
            BufferRole.RESULT: self.result_count,
            BufferRole.INTERMEDIATE: len(self.intermediates),
        }
        scalar_count = self.runtime_scalar_argument_count
        exprs: list[Expr] = [spec.extent for spec in (*self.operands, *self.results)]
        exprs += [spec.extent for spec in self.intermediates]
        for index, stage in enumerate(self.stages):
            for ref in stage.buffers:
                if not 0 <= ref.index < counts[ref.role]:
                    raise InvalidArtifact(
                        f"{name}: stage {index} names {ref.role.value} {ref.index}, "
                        f"but there are {counts[ref.role]}"
                    )
            exprs += stage.scalars
            if stage.geometry is not None:
                exprs += stage.geometry.exprs()
        for expr in exprs:
            if expr.max_index() >= scalar_count:
                raise InvalidArtifact(
                    f"{name}: {expr} names a runtime scalar past the {scalar_count} declared"
                )
        for bound in self.runtime_scalar_bounds:
            if not 0 <= bound.argument_index < scalar_count:
                raise InvalidArtifact(
                    f"{name}: a bound names runtime scalar {bound.argument_index}, "
                    f"but there are {scalar_count}"
                )

    def validate_runtime_scalars(self, args: Sequence[Scalar]) -> None:
        """Check count, types and bounds of the caller's runtime scalars."""
        if len(args) != self.runtime_scalar_argument_count:
            raise LaunchArgumentMismatch(
                f"{self.target} takes {self.runtime_scalar_argument_count} runtime scalars "
                f"({', '.join(s.name for s in self.runtime_scalars)}); got {len(args)}",
                field="runtime_scalars",
            )
        for spec, arg in zip(self.runtime_scalars, args, strict=True):
            if arg.dtype is not spec.dtype:
                raise LaunchArgumentMismatch(
                    f"runtime scalar {spec.name!r} is {spec.dtype.value}; got {arg.dtype.value}",
                    field=f"runtime_scalars.{spec.name}",
                )
        for bound in self.runtime_scalar_bounds:
            spec = self.runtime_scalars[bound.argument_index]
            value = args[bound.argument_index].value
            if value > bound.max_value or (bound.min_value is not None and value < bound.min_value):
                low = "" if bound.min_value is None else f"{bound.min_value}.."
                raise LaunchArgumentMismatch(
                    f"runtime scalar {spec.name!r} is {value}; {self.target} accepts "
                    f"{low}{bound.max_value}",
                    field=f"runtime_scalars.{spec.name}",
                )
