"""The catalog's registry entries: kernels, their parameters and launch geometry, and the
registry that finds them.

Pure data and checks: no driver, no grpc. Names follow the executor's vocabulary
(docs/executor.md).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from accyd.catalog.dtypes import DType, Scalar
from accyd.catalog.expr import Expr, extent_of
from accyd.errors import InvalidArtifact, LaunchArgumentMismatch

__all__ = [
    "POINTER_SIZE",
    "ArtifactFormat",
    "DerivedGeometry",
    "Dim3",
    "FixedGeometry",
    "Geometry",
    "KernelEntry",
    "Param",
    "ParamKind",
    "Registry",
    "check_geometry",
]

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
