"""Reading one ``[[kernel]]`` table of a manifest into a registry entry (docs/catalog.md)."""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from accyd.catalog import expr
from accyd.catalog.dtypes import DType
from accyd.catalog.entries import (
    ArtifactFormat,
    DerivedGeometry,
    FixedGeometry,
    KernelEntry,
    Param,
    ParamKind,
    check_geometry,
)
from accyd.catalog.fields import Where
from accyd.catalog.sources import check_options, local_headers
from accyd.catalog.triton import TritonMetadata, parse_metadata
from accyd.errors import AccyError

__all__ = ["read_kernel"]

T = TypeVar("T")

_BINARY_FORMATS = frozenset({ArtifactFormat.CUDA_CUBIN, ArtifactFormat.TRITON})
_MAX_PARAMS = 256

_KERNEL_FIELDS = {
    "target", "version", "format", "entry", "source", "code", "buffers", "scalars", "params",
    "grid", "block", "shared_memory_bytes", "required_dtypes", "required_features", "options",
    "images", "metadata",
}  # fmt: skip


def read_kernel(path: Path, label: str, index: int, raw: Any) -> KernelEntry:
    """One kernel table; every error a ``CatalogError`` naming the file, entry and field."""
    where = Where(path, label)
    table = where.check(raw, dict, f"kernel[{index}]")
    where.only(table, _KERNEL_FIELDS)
    target = where.get(table, "target", str)
    version = where.get(table, "version", int)
    if version < 1:
        raise where.error("version", "must be 1 or more")
    format_name = where.get(table, "format", str)
    fmt = where.convert("format", lambda: _format(format_name))
    payload = _payload(where, table, fmt)
    triton = _triton(where, table, payload) if fmt is ArtifactFormat.TRITON else None
    params = _params(where, table, triton)
    scalar_names = [p.name for p in params if p.kind is ParamKind.SCALAR]
    scalar_dtypes = tuple(p.dtype for p in params if p.dtype is not None)
    buffer_count = sum(1 for p in params if p.kind is ParamKind.BUFFER)
    entry_name = _entry_name(where, table, triton)
    launch = _geometry(where, table, scalar_names, triton)
    shared = where.optional(table, "shared_memory_bytes", int, 0)
    if triton is not None:
        shared = _from_metadata(where, table, "shared_memory_bytes", triton.shared)
    if fmt is ArtifactFormat.HOST_PY:
        _check_host_entry(where, entry_name, payload)
    return KernelEntry(
        target=target,
        version=version,
        format=fmt,
        entry_name=entry_name,
        argument_count=buffer_count + len(scalar_dtypes),
        runtime_scalar_argument_count=len(scalar_dtypes),
        launch=launch,
        payload=payload,
        scalar_dtypes=scalar_dtypes,
        shared_memory_bytes=shared,
        required_dtypes=tuple(
            where.dtype({"dtype": name}, f"required_dtypes[{i}]")
            for i, name in enumerate(where.optional(table, "required_dtypes", list, []))
        ),
        required_features=tuple(where.optional(table, "required_features", list, [])),
        origin=f"{path} ({target})",
        params=params if "params" in table or triton is not None else (),
        compile_options=_options(where, table, fmt),
        headers=_headers(where, fmt, payload),
        images=_images(where, table, fmt),
        arch=triton.arch if triton is not None else None,
        source_name=str(table.get("source", f"{target}.cu")),
    )


def _format(name: str) -> ArtifactFormat:
    try:
        return ArtifactFormat(name)
    except ValueError:
        names = ", ".join(f.value for f in ArtifactFormat)
        raise ValueError(f"unknown format {name!r}; expected one of {names}") from None


def _payload(where: Where, table: Mapping[str, Any], fmt: ArtifactFormat) -> str | bytes:
    given = [key for key in ("source", "code", "images") if key in table]
    if len(given) != 1 or (fmt is not ArtifactFormat.CUDA_CUBIN and given == ["images"]):
        choices = "'source' (a file) or 'code' (inline)"
        if fmt is ArtifactFormat.CUDA_CUBIN:
            choices += " or 'images' (one cubin per architecture)"
        raise where.error(given[0] if given else "source", f"give exactly one of {choices}")
    if "images" in table:
        return b""
    if "code" in table:
        if fmt in _BINARY_FORMATS:
            raise where.error("code", f"a {fmt.value} kernel is a file: give 'source'")
        return where.get(table, "code", str)
    source = where.path.parent / where.get(table, "source", str)
    try:
        if fmt in _BINARY_FORMATS:
            return source.read_bytes()
        return source.read_text(encoding="utf-8")
    except OSError as error:
        raise where.error("source", f"cannot read {source}: {error.strerror}") from None


def _triton(where: Where, table: Mapping[str, Any], cubin: str | bytes) -> TritonMetadata:
    """The metadata beside a Triton cubin (``NAME.json`` for ``NAME.cubin``, or ``metadata``)."""
    source = where.path.parent / where.get(table, "source", str)
    name = where.optional(table, "metadata", str, source.with_suffix(".json").name)
    path = where.path.parent / name
    try:
        text = path.read_bytes()
    except OSError as error:
        raise where.error("metadata", f"cannot read {path}: {error.strerror}") from None
    metadata = where.convert("metadata", lambda: parse_metadata(text))
    if not cubin or not isinstance(cubin, bytes) or not cubin.startswith(b"\x7fELF"):
        raise where.error("source", f"{source.name} is not a cubin (an ELF file)")
    return metadata


def _from_metadata(where: Where, table: Mapping[str, Any], key: str, value: T) -> T:
    """A field Triton's metadata decides: given in the manifest too, it must agree."""
    if key in table and table[key] != value and table[key] != list(value):  # type: ignore[call-overload]
        raise where.error(key, f"is {table[key]!r}, but Triton's metadata says {value!r}")
    return value


def _entry_name(where: Where, table: Mapping[str, Any], triton: TritonMetadata | None) -> str:
    if triton is not None:
        return _from_metadata(where, table, "entry", triton.name)
    return where.get(table, "entry", str)


def _params(
    where: Where, table: Mapping[str, Any], triton: TritonMetadata | None
) -> tuple[Param, ...]:
    """The kernel's parameters in order: ``params``, or ``buffers`` then ``scalars``."""
    if "params" in table:
        for old in ("buffers", "scalars"):
            if old in table:
                raise where.error(
                    old,
                    "give 'params' (every parameter in order) or 'buffers' and 'scalars', not both",
                )
        items = where.get(table, "params", list)
        if len(items) > _MAX_PARAMS:
            raise where.error("params", f"at most {_MAX_PARAMS} parameters")
        params = tuple(_param(where, i, item) for i, item in enumerate(items))
    elif triton is not None:
        raise where.error("params", "a triton kernel lists its parameters in order")
    else:
        buffers = where.get(table, "buffers", int)
        if buffers < 0:
            raise where.error("buffers", "must be 0 or more")
        params = (Param(ParamKind.BUFFER),) * buffers
        for i, raw in enumerate(where.optional(table, "scalars", list, [])):
            field = f"scalars[{i}]"
            item = where.check(raw, dict, field)
            where.only(item, {"name", "dtype"}, f"{field}.")
            name = where.get(item, "name", str, f"{field}.name")
            params += (Param(ParamKind.SCALAR, name, _scalar_dtype(where, item, field)),)
    names = [p.name for p in params if p.kind is ParamKind.SCALAR]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise where.error(
                "params" if "params" in table else "scalars", f"scalar {name!r} is declared twice"
            )
    return params + (triton.hidden if triton is not None else ())


def _param(where: Where, index: int, raw: Any) -> Param:
    field = f"params[{index}]"
    item = where.check(raw, dict, field)
    kinds = [kind for kind in ParamKind if kind.value in item]
    if len(kinds) != 1:
        raise where.error(
            field,
            'is one of { buffer = "name" }, { scalar = "name", dtype = "u32" } or { null = "why" }',
        )
    kind = kinds[0]
    where.only(
        item, {kind.value, "dtype"} if kind is ParamKind.SCALAR else {kind.value}, f"{field}."
    )
    name = where.get(item, kind.value, str, f"{field}.{kind.value}")
    dtype = _scalar_dtype(where, item, field) if kind is ParamKind.SCALAR else None
    return Param(kind, name, dtype)


def _scalar_dtype(where: Where, item: Mapping[str, Any], field: str) -> DType:
    dtype = where.dtype(item, field)
    if not dtype.is_scalar:
        raise where.error(
            f"{field}.dtype",
            f"{dtype.value} cannot be a scalar parameter; "
            "take an f32 (or the bits as an integer) and convert in the kernel",
        )
    return dtype


def _geometry(
    where: Where,
    table: Mapping[str, Any],
    scalar_names: Sequence[str],
    triton: TritonMetadata | None,
) -> DerivedGeometry:
    if triton is not None:
        block = _from_metadata(where, table, "block", triton.block)
    else:
        block = _dim3(where, table, "block", lambda field, value: where.check(value, int, field))
    indices = {name: index for index, name in enumerate(scalar_names)}

    def grid_dim(field: str, value: Any) -> expr.Expr:
        if isinstance(value, int) and not isinstance(value, bool):
            if not 0 <= value <= expr.U32_MAX:
                raise where.error(field, f"{value} is outside 0..{expr.U32_MAX}")
            return expr.Const(value)
        return where.expr(value, indices, field)

    geometry = DerivedGeometry(_dim3(where, table, "grid", grid_dim), block)
    constant = [_or_one(expr.constant_value(dim)) for dim in geometry.grid]
    try:  # a constant grid past CUDA's limits, or a block, would fail every launch: refuse now
        check_geometry(FixedGeometry((constant[0], constant[1], constant[2]), block))
    except AccyError as error:
        raise where.error("grid", str(error)) from None
    return geometry


def _or_one(value: int | None) -> int:
    return 1 if value is None else value


def _dim3(
    where: Where, table: Mapping[str, Any], key: str, item: Callable[[str, Any], T]
) -> tuple[T, T, T]:
    values = where.get(table, key, list)
    if not 1 <= len(values) <= 3:
        raise where.error(key, "must list 1 to 3 dimensions")
    dims = [item(f"{key}[{i}]", value) for i, value in enumerate(values)]
    while len(dims) < 3:
        dims.append(item(key, 1))
    return (dims[0], dims[1], dims[2])


def _options(where: Where, table: Mapping[str, Any], fmt: ArtifactFormat) -> tuple[str, ...]:
    options = where.optional(table, "options", list, [])
    if options and fmt is not ArtifactFormat.CUDA_CPP:
        raise where.error("options", "only a cuda_cpp kernel is compiled with options")
    for i, option in enumerate(options):
        where.check(option, str, f"options[{i}]")
    return where.convert("options", lambda: check_options(options))


def _headers(
    where: Where, fmt: ArtifactFormat, payload: str | bytes
) -> tuple[tuple[str, str], ...]:
    if fmt is not ArtifactFormat.CUDA_CPP:
        return ()
    text = payload.encode() if isinstance(payload, str) else payload
    return where.convert("source", lambda: local_headers(text, where.path.parent))


def _images(
    where: Where, table: Mapping[str, Any], fmt: ArtifactFormat
) -> tuple[tuple[int, bytes], ...]:
    """``images = { sm_90 = "k.sm_90.cubin", sm_80 = "k.sm_80.cubin" }``, read now."""
    if "images" not in table:
        return ()
    images = where.get(table, "images", dict)
    if not images:
        raise where.error("images", "lists no image")
    out = []
    for arch, name in images.items():
        field = f"images.{arch}"
        if not (arch.startswith("sm_") and arch[3:].isdigit() and 2 <= len(arch) - 3 <= 3):
            raise where.error(field, "keys are architectures such as sm_90 or sm_80")
        path = where.path.parent / where.check(name, str, field)
        try:
            out.append((int(arch[3:]), path.read_bytes()))
        except OSError as error:
            raise where.error(field, f"cannot read {path}: {error.strerror}") from None
    return tuple(sorted(out))


def _check_host_entry(where: Where, entry: str, payload: str | bytes) -> None:
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
