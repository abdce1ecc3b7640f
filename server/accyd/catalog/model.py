"""The catalog's data model: registry entries, pipelines, stages, and their validation.

Pure data and checks: no driver, no grpc. Names follow the executor's vocabulary
(docs/executor.md); every check raises a domain error before anything is allocated
or launched.
"""

from __future__ import annotations

import enum
import re
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from accyd.catalog.dtypes import DType, Scalar
from accyd.catalog.expr import Expr, extent_of
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
    "Pipeline",
    "Registry",
    "ScalarBound",
    "ScalarSpec",
    "Stage",
]

MAX_BYTE_SIZE = 2**63 - 1
"""The largest byte size any buffer may have; an extent past it is an overflow."""

_GRID_LIMITS = (2**31 - 1, 65535, 65535)
_BLOCK_LIMITS = (1024, 1024, 64)


class ArtifactFormat(enum.Enum):
    """How a registry entry's payload is written, and so which backend loads it."""

    CUDA_CPP = "cuda_cpp"
    """CUDA C++ source, compiled with NVRTC for the device's architecture."""
    CUDA_PTX = "cuda_ptx"
    """PTX text, JIT-compiled by the driver at load."""
    CUDA_CUBIN = "cuda_cubin"
    """A cubin (or fatbin) built for the device."""
    HOST_PY = "host_py"
    """A Python function over whole grids, run by the host backend on numpy."""
    METAL_MSL = "metal_msl"
    """Metal shading language; named so catalogs can carry it, loaded by no backend here."""


Dim3 = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class FixedGeometry:
    """A grid and a threadgroup (block) that do not depend on the arguments."""

    grid: Dim3
    block: Dim3

    def resolve(self, scalars: Sequence[Scalar]) -> FixedGeometry:
        return self


@dataclass(frozen=True, slots=True)
class DerivedGeometry:
    """Grid dimensions derived from the stage's scalar arguments; the block is fixed."""

    grid: tuple[Expr, Expr, Expr]
    block: Dim3

    def resolve(self, scalars: Sequence[Scalar]) -> FixedGeometry:
        grid = tuple(extent_of(dim, scalars) for dim in self.grid)
        return FixedGeometry((grid[0], grid[1], grid[2]), self.block)


Geometry = FixedGeometry | DerivedGeometry


def check_geometry(geometry: FixedGeometry) -> None:
    """Refuse a grid or block the device cannot launch (CUDA's limits, shared by all)."""
    for axis, (size, limit) in enumerate(zip(geometry.grid, _GRID_LIMITS, strict=True)):
        if not 1 <= size <= limit:
            raise LaunchArgumentMismatch(
                f"grid dimension {axis} is {size}; it must be 1..{limit}", field="runtime_scalars"
            )
    threads = geometry.block[0] * geometry.block[1] * geometry.block[2]
    if any(not 1 <= b <= lim for b, lim in zip(geometry.block, _BLOCK_LIMITS, strict=True)) or (
        threads > 1024
    ):
        raise InvalidArtifact(f"block {geometry.block} is outside the device's limits")


@dataclass(frozen=True, slots=True)
class KernelEntry:
    """One compiled-or-compilable kernel in the registry (a registry entry: docs/executor.md).

    Its arguments are ``argument_count - runtime_scalar_argument_count`` buffers
    followed by the scalars, in the order a stage binds them.
    """

    target: str
    version: int
    format: ArtifactFormat
    entry_name: str
    argument_count: int
    runtime_scalar_argument_count: int
    launch: Geometry
    payload: str | bytes
    scalar_dtypes: tuple[DType, ...] | None = None
    shared_memory_bytes: int = 0
    required_dtypes: tuple[DType, ...] = ()
    required_features: tuple[str, ...] = ()
    origin: str = "<memory>"

    def scalar_argument_count(self) -> int:
        if not 0 <= self.runtime_scalar_argument_count <= self.argument_count:
            raise InvalidArtifact(
                f"{self.target} v{self.version}: {self.runtime_scalar_argument_count} scalar "
                f"arguments of {self.argument_count} in all"
            )
        return self.runtime_scalar_argument_count

    def buffer_argument_count(self) -> int:
        return self.argument_count - self.scalar_argument_count()

    def expected_scalar_dtypes(self) -> tuple[DType, ...]:
        if self.scalar_dtypes is not None:
            return self.scalar_dtypes
        return (DType.U32,) * self.scalar_argument_count()

    @property
    def key(self) -> tuple[str, int, ArtifactFormat]:
        return (self.target, self.version, self.format)


class Registry:
    """Every kernel entry the daemon knows, found by (target, version, format)."""

    def __init__(self, entries: Iterable[KernelEntry] = ()) -> None:
        self._entries: dict[tuple[str, int, ArtifactFormat], KernelEntry] = {}
        for entry in entries:
            if entry.key in self._entries:
                raise InvalidArtifact(
                    f"registry entry {entry.target} v{entry.version} ({entry.format.value}) "
                    f"is defined twice: {self._entries[entry.key].origin} and {entry.origin}"
                )
            self._entries[entry.key] = entry

    def find(self, target: str, version: int, format: ArtifactFormat) -> KernelEntry | None:
        return self._entries.get((target, version, format))

    @property
    def entries(self) -> tuple[KernelEntry, ...]:
        return tuple(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)


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


_ARG = re.compile(r"\barg(\d+)\b")
"""How an extent prints a runtime scalar (``arg0``): replaced by its name in messages."""


@dataclass(frozen=True, slots=True)
class BufferSpec:
    """An operand or result: its name, dtype and the fewest elements it must hold."""

    name: str
    dtype: DType
    extent: Expr

    def byte_size(self, args: Sequence[Scalar]) -> int:
        return _byte_size(self.extent, self.dtype, args, f"{self.name}")

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
        known = min(len(names), len(args))

        def named(found: re.Match[str]) -> str:
            index = int(found[1])
            return names[index] if index < len(names) else found[0]

        extent = _ARG.sub(named, str(self.extent))
        used = dict.fromkeys(int(index) for index in _ARG.findall(str(self.extent)))
        values = "".join(f", {names[i]} = {args[i].value}" for i in used if i < known)
        raise LaunchArgumentMismatch(
            f"{role} {self.name!r} holds {have} bytes; these runtime scalars need {needed} "
            f"({extent} x {self.dtype.value}{values})",
            field=f"{role}s[{index}]",
        )


@dataclass(frozen=True, slots=True)
class IntermediateSpec:
    """A scratch buffer between stages, sized from the runtime scalars."""

    dtype: DType
    extent: Expr
    name: str = ""

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
class Stage:
    """One kernel launch of a pipeline: which entry, which buffers, which scalars."""

    target: str
    version: int
    buffers: tuple[BufferRef, ...]
    scalars: tuple[Expr, ...]


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
