"""The catalog's data model: registry entries, pipelines, stages, and their validation.

Pure data and checks: no driver, no grpc. Names follow the executor's vocabulary
(docs/executor.md); every check raises a domain error before anything is allocated
or launched.
"""

from __future__ import annotations

import enum
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from accyd.catalog.dtypes import DType, Scalar
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

_GRID_LIMITS = (2**31 - 1, 65535, 65535)
_BLOCK_LIMITS = (1024, 1024, 64)


class ArtifactFormat(enum.Enum):
    """How a registry entry's payload is written, and so which backend loads it."""

    CUDA_CPP = "cuda_cpp"
    """CUDA C++ source, compiled with NVRTC for the device's architecture."""
    CUDA_PTX = "cuda_ptx"
    """PTX text, JIT-compiled by the driver at load."""
    CUDA_CUBIN = "cuda_cubin"
    """A cubin (or fatbin) built for the device, or one cubin per architecture."""
    TRITON = "triton"
    """A Triton-lang kernel as Triton's compiler writes it: a cubin and its metadata."""
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


class ParamKind(enum.Enum):
    """What one kernel parameter is, in the kernel's own order."""

    BUFFER = "buffer"
    """A device pointer to a buffer the stage binds."""
    SCALAR = "scalar"
    """A value of the stage's scalars, at its dtype's size."""
    NULL = "null"
    """A pointer the daemon passes as 0 (Triton's unused scratch pointers)."""


POINTER_SIZE = 8


@dataclass(frozen=True, slots=True)
class Param:
    """One parameter of a kernel: its kind, its name (for messages) and a scalar's dtype."""

    kind: ParamKind
    name: str = ""
    dtype: DType | None = None

    @property
    def size(self) -> int:
        """The bytes the kernel reads for it: a pointer, or the scalar's own size."""
        if self.kind is ParamKind.SCALAR:
            assert self.dtype is not None
            return self.dtype.itemsize
        return POINTER_SIZE

    def describe(self, index: int) -> str:
        what = self.kind.value if self.dtype is None else f"{self.dtype.value} scalar"
        return f"parameter {index}" + (f" ({self.name!r}, {what})" if self.name else f" ({what})")


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

    Its arguments are ``argument_count - runtime_scalar_argument_count`` buffers and
    the scalars, bound by a stage in that order; ``params`` lays them out in the
    kernel's own order (with pointers the daemon supplies), and is buffers then
    scalars when empty.
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
    params: tuple[Param, ...] = ()
    compile_options: tuple[str, ...] = ()
    """NVRTC options from the manifest's allow-listed ``options`` (cuda_cpp)."""
    headers: tuple[tuple[str, str], ...] = ()
    """(include name, text) of each header the source includes from beside its manifest."""
    images: tuple[tuple[int, bytes], ...] = ()
    """(compute capability as 90, cubin) per architecture; the device's own is loaded."""
    arch: int | None = None
    """The one architecture the payload was built for, where known (Triton's target)."""
    source_name: str = "kernel.cu"
    """The source file's name (compile errors name it with a line)."""

    def layout(self) -> tuple[Param, ...]:
        """Every parameter in the kernel's order (buffers then scalars unless declared)."""
        if self.params:
            return self.params
        dtypes = self.expected_scalar_dtypes()
        buffers = (Param(ParamKind.BUFFER),) * self.buffer_argument_count()
        return buffers + tuple(Param(ParamKind.SCALAR, dtype=d) for d in dtypes)

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
