"""Reading catalog manifests: TOML files of ``[[kernel]]`` and ``[[pipeline]]`` tables.

Every error is a ``CatalogError`` naming the file, the entry and the field, so
an operator can fix a manifest without reading this code. The format is
documented in ``docs/catalog.md``; kernel tables are read by ``kernel_table``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accyd.catalog import expr
from accyd.catalog.dtypes import DType
from accyd.catalog.fields import Where
from accyd.catalog.kernel_table import read_kernel
from accyd.catalog.model import (
    MAX_BYTE_SIZE,
    BufferRef,
    BufferRole,
    BufferSpec,
    IntermediateSpec,
    KernelEntry,
    Pipeline,
    ScalarBound,
    ScalarSpec,
    Stage,
    StageGeometry,
)
from accyd.errors import CatalogError, LaunchArgumentMismatch

__all__ = ["Manifest", "read_manifest"]


@dataclass(frozen=True, slots=True)
class Manifest:
    """What one manifest file declares."""

    path: Path
    kernels: tuple[KernelEntry, ...]
    pipelines: tuple[Pipeline, ...]


def read_manifest(path: Path) -> Manifest:
    """Read one manifest file; payload sources are read relative to it."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise CatalogError(f"{path}: cannot read: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise CatalogError(f"{path}: not valid TOML: {error}") from None
    top = Where(path, "manifest")
    top.only(data, {"kernel", "pipeline"})
    kernels = [
        read_kernel(path, _label("kernel", index, table), index, table)
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


_PIPELINE_FIELDS = {
    "target", "version", "description", "scalars", "operands", "results", "intermediates", "stage",
}  # fmt: skip
_MAX_DIMS = 8


def _read_pipeline(path: Path, index: int, raw: Any) -> Pipeline:
    where = Where(path, _label("pipeline", index, raw))
    table = where.check(raw, dict, f"pipeline[{index}]")
    where.only(table, _PIPELINE_FIELDS)
    target = where.get(table, "target", str)
    scalars, bounds = _runtime_scalars(where, table)
    names = {spec.name: i for i, spec in enumerate(scalars)}
    buffers: dict[str, BufferRef] = {}
    zeroed: list[bool] = []  # each intermediate's, read with its table

    def buffer_list(key: str, role: BufferRole) -> list[BufferSpec]:
        out = []
        for i, raw_item in enumerate(where.optional(table, key, list, [])):
            field = f"{key}[{i}]"
            item = where.check(raw_item, dict, field)
            allowed = {"name", "dtype", "extent"} | (
                {"zeroed"} if role is BufferRole.INTERMEDIATE else {"shape"}
            )
            where.only(item, allowed, f"{field}.")
            name = where.get(item, "name", str, f"{field}.name")
            if name in buffers or name in names:
                raise where.error(f"{field}.name", f"{name!r} names two things")
            buffers[name] = BufferRef(role, i)
            dtype = where.dtype(item, field)
            out.append(_sized(where, item, field, name, dtype, names))
            if role is BufferRole.INTERMEDIATE:
                zeroed.append(where.check(item.get("zeroed", False), bool, f"{field}.zeroed"))
        return out

    operands = buffer_list("operands", BufferRole.OPERAND)
    results = buffer_list("results", BufferRole.RESULT)
    intermediates = [
        IntermediateSpec(spec.dtype, spec.extent, spec.name, zeroed=zero)
        for spec, zero in zip(
            buffer_list("intermediates", BufferRole.INTERMEDIATE), zeroed, strict=True
        )
    ]
    stages = [
        _read_stage(where, i, raw_stage, buffers, names)
        for i, raw_stage in enumerate(where.get(table, "stage", list))
    ]
    if not stages:
        raise where.error("stage", "a pipeline needs at least one stage")
    version = where.get(table, "version", int)
    if version < 1:
        raise where.error("version", "must be 1 or more")
    return Pipeline(
        target=target,
        version=version,
        operands=tuple(operands),
        results=tuple(results),
        runtime_scalars=tuple(scalars),
        stages=tuple(stages),
        intermediates=tuple(intermediates),
        runtime_scalar_bounds=tuple(bounds),
        description=where.optional(table, "description", str, ""),
        origin=f"{path} ({target})",
    )


def _sized(
    where: Where,
    item: Mapping[str, Any],
    field: str,
    name: str,
    dtype: DType,
    names: Mapping[str, int],
) -> BufferSpec:
    """A buffer's ``extent`` (elements), or its ``shape`` (dims, whose product is the extent)."""
    if ("extent" in item) == ("shape" in item):
        raise where.error(f"{field}.extent", "give exactly one of 'extent' or 'shape'")
    if "extent" in item:
        extent = where.expr(item["extent"], names, f"{field}.extent")
        _check_constant(where, f"{field}.extent", extent, dtype)
        return BufferSpec(name, dtype, extent)
    dims = where.check(item["shape"], list, f"{field}.shape")
    if not 1 <= len(dims) <= _MAX_DIMS:
        raise where.error(f"{field}.shape", f"must list 1 to {_MAX_DIMS} dims")
    shape = tuple(_dim(where, f"{field}.shape[{i}]", dim, names) for i, dim in enumerate(dims))
    extent = shape[0]
    for dim in shape[1:]:
        extent = expr.Mul(extent, dim)
    _check_constant(where, f"{field}.shape", extent, dtype)
    return BufferSpec(name, dtype, extent, shape)


def _dim(where: Where, field: str, dim: Any, names: Mapping[str, int]) -> expr.Expr:
    """One dim of a shape: a positive integer, or an expression over the runtime scalars."""
    if isinstance(dim, int) and not isinstance(dim, bool):
        if not 1 <= dim <= expr.U32_MAX:
            raise where.error(field, f"{dim} is outside 1..{expr.U32_MAX}")
        return expr.Const(dim)
    return where.expr(dim, names, field)


def _check_constant(where: Where, field: str, extent: expr.Expr, dtype: DType) -> None:
    """An extent that names no scalar is checked now: 0 or too large would fail every launch."""
    try:
        value = expr.constant_value(extent)
    except CatalogError:
        raise
    except Exception as error:  # the domain's evaluation errors
        raise where.error(field, str(error)) from None
    if value is None:
        return
    if value == 0 or value * dtype.itemsize > MAX_BYTE_SIZE:
        raise where.error(
            field, f"is {value} elements; it must be 1 to {MAX_BYTE_SIZE // dtype.itemsize}"
        )


def _runtime_scalars(
    where: Where, table: Mapping[str, Any]
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
        if not dtype.is_scalar:
            raise where.error(f"{field}.dtype", f"{dtype.value} cannot be a runtime scalar")
        specs.append(ScalarSpec(name, dtype))
        low, high = (_bound(where, item, key, dtype, f"{field}.{key}") for key in ("min", "max"))
        if high is not None:
            if low is not None and low > high:
                raise where.error(f"{field}.min", f"min {low} is above max {high}")
            bounds.append(ScalarBound(index, high, low))
        elif low is not None:
            raise where.error(f"{field}.max", "a scalar with a 'min' needs a 'max' too")
    return specs, bounds


def _bound(
    where: Where, item: Mapping[str, Any], key: str, dtype: DType, field: str
) -> int | float | None:
    if key not in item:
        return None
    value = where.check(item[key], int if dtype.is_integer else float, field)
    try:
        return dtype.check_value(value)
    except LaunchArgumentMismatch as error:
        raise where.error(field, str(error)) from None


_STAGE_FIELDS = {"kernel", "version", "buffers", "scalars", "grid", "block", "shared_memory_bytes"}


def _read_stage(
    where: Where,
    index: int,
    raw: Any,
    buffers: Mapping[str, BufferRef],
    names: Mapping[str, int],
) -> Stage:
    field = f"stage[{index}]"
    table = where.check(raw, dict, field)
    where.only(table, _STAGE_FIELDS, f"{field}.")
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
        geometry=_stage_geometry(where, table, field, names),
    )


def _stage_geometry(
    where: Where, table: Mapping[str, Any], field: str, names: Mapping[str, int]
) -> StageGeometry | None:
    """A stage's own ``grid``, ``block`` and ``shared_memory_bytes`` over the runtime scalars."""

    def one(key: str, value: Any) -> expr.Expr:
        if isinstance(value, int) and not isinstance(value, bool):
            if not 0 <= value <= expr.U32_MAX:
                raise where.error(key, f"{value} is outside 0..{expr.U32_MAX}")
            return expr.Const(value)
        return where.expr(value, names, key)

    def dim3(key: str) -> tuple[expr.Expr, expr.Expr, expr.Expr] | None:
        if key not in table:
            return None
        values = where.check(table[key], list, f"{field}.{key}")
        if not 1 <= len(values) <= 3:
            raise where.error(f"{field}.{key}", "must list 1 to 3 dimensions")
        dims = [one(f"{field}.{key}[{i}]", v) for i, v in enumerate(values)]
        dims += [expr.Const(1)] * (3 - len(dims))
        return (dims[0], dims[1], dims[2])

    shared = table.get("shared_memory_bytes")
    geometry = StageGeometry(
        dim3("grid"),
        dim3("block"),
        None if shared is None else one(f"{field}.shared_memory_bytes", shared),
    )
    return geometry if geometry != StageGeometry() else None
