"""Reading catalog manifests: TOML files of ``[[kernel]]`` and ``[[pipeline]]`` tables.

Every error is a ``CatalogError`` naming the file, the entry and the field, so
an operator can fix a manifest without reading this code. The format is
documented in ``docs/catalog.md``.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from accyd.catalog import expr
from accyd.catalog.dtypes import DType
from accyd.catalog.model import (
    ArtifactFormat,
    BufferRef,
    BufferRole,
    BufferSpec,
    DerivedGeometry,
    Geometry,
    IntermediateSpec,
    KernelEntry,
    Pipeline,
    ScalarBound,
    ScalarSpec,
    Stage,
)
from accyd.errors import CatalogError, LaunchArgumentMismatch

__all__ = ["Manifest", "read_manifest"]

T = TypeVar("T")

_BINARY_FORMATS = frozenset({ArtifactFormat.CUDA_CUBIN})


@dataclass(frozen=True, slots=True)
class Manifest:
    """What one manifest file declares."""

    path: Path
    kernels: tuple[KernelEntry, ...]
    pipelines: tuple[Pipeline, ...]


class _Where:
    """The place being read (file, entry, field path), for error messages."""

    def __init__(self, path: Path, entry: str) -> None:
        self.path = path
        self.entry = entry

    def error(self, field: str, problem: str) -> CatalogError:
        return CatalogError(f"{self.path}: {self.entry}: field {field!r}: {problem}", field=field)

    def get(self, table: Mapping[str, Any], key: str, kind: type[T], field: str = "") -> T:
        name = field or key
        if key not in table:
            raise self.error(name, "is required")
        return self.check(table[key], kind, name)

    def optional(self, table: Mapping[str, Any], key: str, kind: type[T], default: T) -> T:
        if key not in table:
            return default
        return self.check(table[key], kind, key)

    def check(self, value: Any, kind: type[T], field: str) -> T:
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)  # type: ignore[return-value]
        if not ok:
            raise self.error(field, f"must be {kind.__name__}, not {type(value).__name__}")
        return value  # type: ignore[no-any-return]

    def only(self, table: Mapping[str, Any], allowed: set[str], prefix: str = "") -> None:
        for key in table:
            if key not in allowed:
                raise self.error(
                    f"{prefix}{key}", f"is not a known field ({', '.join(sorted(allowed))})"
                )

    def convert(self, field: str, convert: Callable[[], T]) -> T:
        try:
            return convert()
        except ValueError as error:
            raise self.error(field, str(error)) from None

    def dtype(self, table: Mapping[str, Any], field: str) -> DType:
        name = self.get(table, "dtype", str, f"{field}.dtype")
        try:
            return DType.parse(name)
        except ValueError as error:
            raise self.error(f"{field}.dtype", str(error)) from None

    def expr(self, text: Any, names: Mapping[str, int], field: str) -> expr.Expr:
        source = self.check(text, str, field)
        try:
            return expr.parse(source, names)
        except ValueError as error:
            raise self.error(field, str(error)) from None


def read_manifest(path: Path) -> Manifest:
    """Read one manifest file; payload sources are read relative to it."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise CatalogError(f"{path}: cannot read: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise CatalogError(f"{path}: not valid TOML: {error}") from None
    top = _Where(path, "manifest")
    top.only(data, {"kernel", "pipeline"})
    kernels = [
        _read_kernel(path, index, table)
        for index, table in enumerate(top.optional(data, "kernel", list, []))
    ]
    pipelines = [
        _read_pipeline(path, index, table)
        for index, table in enumerate(top.optional(data, "pipeline", list, []))
    ]
    return Manifest(path, tuple(kernels), tuple(pipelines))


def _label(kind: str, index: int, table: Any) -> str:
    target = table.get("target") if isinstance(table, dict) else None
    return f"{kind} {target!r}" if isinstance(target, str) else f"{kind} #{index + 1}"


_KERNEL_FIELDS = {
    "target", "version", "format", "entry", "source", "code", "buffers", "scalars", "grid",
    "block", "shared_memory_bytes", "required_dtypes", "required_features",
}  # fmt: skip


def _read_kernel(path: Path, index: int, raw: Any) -> KernelEntry:
    where = _Where(path, _label("kernel", index, raw))
    table = where.check(raw, dict, f"kernel[{index}]")
    where.only(table, _KERNEL_FIELDS)
    target = where.get(table, "target", str)
    version = _positive(where, table, "version")
    format_name = where.get(table, "format", str)
    fmt = where.convert("format", lambda: _format(format_name))
    buffers = where.get(table, "buffers", int)
    if buffers < 0:
        raise where.error("buffers", "must be 0 or more")
    scalar_names, scalar_dtypes = _scalar_list(where, table)
    launch = _geometry(where, table, scalar_names)
    entry_name = where.get(table, "entry", str)
    payload = _payload(where, table, fmt)
    if fmt is ArtifactFormat.HOST_PY:
        _check_host_entry(where, entry_name, payload)
    return KernelEntry(
        target=target,
        version=version,
        format=fmt,
        entry_name=entry_name,
        argument_count=buffers + len(scalar_dtypes),
        runtime_scalar_argument_count=len(scalar_dtypes),
        launch=launch,
        payload=payload,
        scalar_dtypes=scalar_dtypes,
        shared_memory_bytes=where.optional(table, "shared_memory_bytes", int, 0),
        required_dtypes=tuple(
            where.dtype({"dtype": name}, f"required_dtypes[{i}]")
            for i, name in enumerate(where.optional(table, "required_dtypes", list, []))
        ),
        required_features=tuple(where.optional(table, "required_features", list, [])),
        origin=f"{path} ({target})",
    )


def _positive(where: _Where, table: Mapping[str, Any], key: str) -> int:
    value = where.get(table, key, int)
    if value < 1:
        raise where.error(key, "must be 1 or more")
    return value


def _format(name: str) -> ArtifactFormat:
    try:
        return ArtifactFormat(name)
    except ValueError:
        names = ", ".join(f.value for f in ArtifactFormat)
        raise ValueError(f"unknown format {name!r}; expected one of {names}") from None


def _scalar_list(where: _Where, table: Mapping[str, Any]) -> tuple[list[str], tuple[DType, ...]]:
    names: list[str] = []
    dtypes: list[DType] = []
    for index, raw in enumerate(where.optional(table, "scalars", list, [])):
        field = f"scalars[{index}]"
        item = where.check(raw, dict, field)
        where.only(item, {"name", "dtype"}, f"{field}.")
        name = where.get(item, "name", str, f"{field}.name")
        if name in names:
            raise where.error(f"{field}.name", f"{name!r} is declared twice")
        names.append(name)
        dtypes.append(where.dtype(item, field))
    return names, tuple(dtypes)


def _geometry(where: _Where, table: Mapping[str, Any], scalar_names: Sequence[str]) -> Geometry:
    block = _dim3(where, table, "block", lambda field, value: where.check(value, int, field))
    indices = {name: index for index, name in enumerate(scalar_names)}

    def grid_dim(field: str, value: Any) -> expr.Expr:
        if isinstance(value, int) and not isinstance(value, bool):
            return expr.Const(value)
        return where.expr(value, indices, field)

    grid = _dim3(where, table, "grid", grid_dim)
    return DerivedGeometry(grid, block)


def _dim3(
    where: _Where, table: Mapping[str, Any], key: str, item: Callable[[str, Any], T]
) -> tuple[T, T, T]:
    values = where.get(table, key, list)
    if not 1 <= len(values) <= 3:
        raise where.error(key, "must list 1 to 3 dimensions")
    dims = [item(f"{key}[{i}]", value) for i, value in enumerate(values)]
    while len(dims) < 3:
        dims.append(item(key, 1))
    return (dims[0], dims[1], dims[2])


def _check_host_entry(where: _Where, entry: str, payload: str | bytes) -> None:
    """Refuse a host_py kernel whose code does not define its entry (found now, not at load)."""
    source = payload.decode() if isinstance(payload, bytes) else payload
    try:
        module = ast.parse(source)
    except SyntaxError as error:
        raise where.error(
            "code", f"is not valid Python: line {error.lineno}: {error.msg}"
        ) from None
    if entry not in _top_level_names(module):
        raise where.error(
            "entry",
            f"the code defines no function {entry!r}; name one of its functions "
            f"(def {entry}(grid, block, buffers, scalars): ...)",
        )


def _top_level_names(module: ast.Module) -> set[str]:
    """The names a module binds at its top level: functions, assignments, imports."""
    names: set[str] = set()
    for node in module.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _payload(where: _Where, table: Mapping[str, Any], fmt: ArtifactFormat) -> str | bytes:
    if ("source" in table) == ("code" in table):
        raise where.error("source", "give exactly one of 'source' (a file) or 'code' (inline)")
    if "code" in table:
        return where.get(table, "code", str)
    source = where.path.parent / where.get(table, "source", str)
    try:
        if fmt in _BINARY_FORMATS:
            return source.read_bytes()
        return source.read_text(encoding="utf-8")
    except OSError as error:
        raise where.error("source", f"cannot read {source}: {error.strerror}") from None


_PIPELINE_FIELDS = {
    "target", "version", "description", "scalars", "operands", "results", "intermediates", "stage",
}  # fmt: skip


def _read_pipeline(path: Path, index: int, raw: Any) -> Pipeline:
    where = _Where(path, _label("pipeline", index, raw))
    table = where.check(raw, dict, f"pipeline[{index}]")
    where.only(table, _PIPELINE_FIELDS)
    target = where.get(table, "target", str)
    scalars, bounds = _runtime_scalars(where, table)
    names = {spec.name: i for i, spec in enumerate(scalars)}
    buffers: dict[str, BufferRef] = {}

    def buffer_list(key: str, role: BufferRole) -> list[tuple[str, DType, expr.Expr]]:
        out = []
        for i, raw_item in enumerate(where.optional(table, key, list, [])):
            field = f"{key}[{i}]"
            item = where.check(raw_item, dict, field)
            where.only(item, {"name", "dtype", "extent"}, f"{field}.")
            name = where.get(item, "name", str, f"{field}.name")
            if name in buffers or name in names:
                raise where.error(f"{field}.name", f"{name!r} names two things")
            buffers[name] = BufferRef(role, i)
            dtype = where.dtype(item, field)
            if "extent" not in item:
                raise where.error(f"{field}.extent", "is required")
            extent = where.expr(item["extent"], names, f"{field}.extent")
            out.append((name, dtype, extent))
        return out

    operands = [BufferSpec(*spec) for spec in buffer_list("operands", BufferRole.OPERAND)]
    results = [BufferSpec(*spec) for spec in buffer_list("results", BufferRole.RESULT)]
    intermediates = [
        IntermediateSpec(dtype, extent, name)
        for name, dtype, extent in buffer_list("intermediates", BufferRole.INTERMEDIATE)
    ]
    stages = [
        _read_stage(where, i, raw_stage, buffers, names)
        for i, raw_stage in enumerate(where.get(table, "stage", list))
    ]
    if not stages:
        raise where.error("stage", "a pipeline needs at least one stage")
    return Pipeline(
        target=target,
        version=_positive(where, table, "version"),
        operands=tuple(operands),
        results=tuple(results),
        runtime_scalars=tuple(scalars),
        stages=tuple(stages),
        intermediates=tuple(intermediates),
        runtime_scalar_bounds=tuple(bounds),
        description=where.optional(table, "description", str, ""),
        origin=f"{path} ({target})",
    )


def _runtime_scalars(
    where: _Where, table: Mapping[str, Any]
) -> tuple[list[ScalarSpec], list[ScalarBound]]:
    specs: list[ScalarSpec] = []
    bounds: list[ScalarBound] = []
    for index, raw in enumerate(where.optional(table, "scalars", list, [])):
        field = f"scalars[{index}]"
        item = where.check(raw, dict, field)
        where.only(item, {"name", "dtype", "min", "max"}, f"{field}.")
        name = where.get(item, "name", str, f"{field}.name")
        if any(spec.name == name for spec in specs):
            raise where.error(f"{field}.name", f"{name!r} is declared twice")
        dtype = where.dtype(item, field)
        specs.append(ScalarSpec(name, dtype))
        low, high = (_bound(where, item, key, dtype, f"{field}.{key}") for key in ("min", "max"))
        if high is not None:
            bounds.append(ScalarBound(index, high, low))
        elif low is not None:
            raise where.error(f"{field}.max", "a scalar with a 'min' needs a 'max' too")
    return specs, bounds


def _bound(
    where: _Where, item: Mapping[str, Any], key: str, dtype: DType, field: str
) -> int | float | None:
    if key not in item:
        return None
    value = where.check(item[key], int if dtype.is_integer else float, field)
    try:
        return dtype.check_value(value)
    except LaunchArgumentMismatch as error:
        raise where.error(field, str(error)) from None


def _read_stage(
    where: _Where,
    index: int,
    raw: Any,
    buffers: Mapping[str, BufferRef],
    names: Mapping[str, int],
) -> Stage:
    field = f"stage[{index}]"
    table = where.check(raw, dict, field)
    where.only(table, {"kernel", "version", "buffers", "scalars"}, f"{field}.")
    refs = []
    for i, name in enumerate(where.get(table, "buffers", list, f"{field}.buffers")):
        name = where.check(name, str, f"{field}.buffers[{i}]")
        if name not in buffers:
            known = ", ".join(buffers) or "none"
            raise where.error(
                f"{field}.buffers[{i}]", f"{name!r} is no buffer of the pipeline ({known})"
            )
        refs.append(buffers[name])
    scalars = []
    for i, text in enumerate(where.optional(table, "scalars", list, [])):
        scalars.append(where.expr(text, names, f"{field}.scalars[{i}]"))
    version = where.get(table, "version", int, f"{field}.version")
    return Stage(
        target=where.get(table, "kernel", str, f"{field}.kernel"),
        version=version,
        buffers=tuple(refs),
        scalars=tuple(scalars),
    )
