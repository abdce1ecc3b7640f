"""Element types between numpy and the wire; runtime scalars typed by a pipeline's declaration."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from accy.errors import FieldViolation, InvalidArgument
from accy.protocol import DTYPES, dtype_named, dtype_of_numpy, dtype_of_wire
from accy.protocol.launch.v1 import launch_pb2

if TYPE_CHECKING:
    from accy._models import ScalarSpec

__all__ = [
    "DTypeLike",
    "from_wire",
    "name_of",
    "pack_scalars",
    "to_numpy",
    "to_wire",
]

DTypeLike = np.dtype[Any] | type[np.generic] | str


def to_numpy(dtype: DTypeLike) -> np.dtype[Any]:
    """``dtype`` as a little-endian numpy dtype, accepting accy names such as ``"f32"``."""
    if isinstance(dtype, str):
        named = dtype_named(dtype)
        if named is not None:
            return named.numpy
    resolved = np.dtype(dtype).newbyteorder("<")
    entry = dtype_of_numpy(resolved)
    if entry is None:
        names = ", ".join(str(e.numpy) for e in DTYPES)
        raise TypeError(f"numpy dtype {resolved} has no accy dtype; expected one of {names}")
    return entry.numpy


def to_wire(dtype: DTypeLike | None) -> launch_pb2.DType:
    """The protocol enum for ``dtype`` (``DTYPE_UNSPECIFIED`` for ``None``)."""
    if dtype is None:
        return launch_pb2.DTYPE_UNSPECIFIED
    entry = dtype_of_numpy(to_numpy(dtype))
    assert entry is not None  # to_numpy returns only accy dtypes
    return entry.wire


def from_wire(wire: launch_pb2.DType) -> np.dtype[Any] | None:
    """The numpy dtype for a protocol enum (``None`` for unspecified or unknown values)."""
    entry = dtype_of_wire(wire)
    return entry.numpy if entry is not None else None


def name_of(dtype: np.dtype[Any] | None) -> str:
    """The accy name of a dtype (``"f32"``), as manifests and ``accy pipelines`` print it."""
    if dtype is None:
        return "unspecified"
    entry = dtype_of_numpy(to_numpy(dtype))
    assert entry is not None
    return entry.name


def _field(name: str) -> str:
    return f"runtime_scalars[{name}]"


def _bad(name: str, why: str) -> InvalidArgument:
    return InvalidArgument(
        f"runtime scalar {name!r}: {why}",
        reason="LOCAL_SCALAR_INVALID",
        field_violations=[FieldViolation(_field(name), why)],
    )


def _scalar(field: str, value: float) -> launch_pb2.Scalar:
    scalar = launch_pb2.Scalar()
    setattr(scalar, field, value)
    return scalar


def _pack(spec: ScalarSpec, value: object) -> launch_pb2.Scalar:
    dtype = spec.dtype
    name = name_of(dtype)
    entry = dtype_named(name)
    if entry is None or not entry.scalar:
        raise _bad(spec.name, f"the protocol has no {name} scalars")
    if isinstance(value, bool | np.bool_):
        raise _bad(spec.name, f"expected a number for {name}, got a boolean")
    if dtype.kind in "iu":
        if not isinstance(value, int | np.integer):
            raise _bad(spec.name, f"expected an integer for {name}, got {value!r}")
        info = np.iinfo(dtype)
        integer = int(value)
        if not info.min <= integer <= info.max:
            raise _bad(spec.name, f"{integer} does not fit {name} ({info.min}..{info.max})")
        return _scalar(name, integer)
    if not isinstance(value, int | float | np.integer | np.floating):
        raise _bad(spec.name, f"expected a number for {name}, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or abs(number) > float(np.finfo(dtype).max):
        raise _bad(spec.name, f"{number} is not a finite {name}")
    return _scalar(name, number)


def pack_scalars(
    specs: Sequence[ScalarSpec], values: Mapping[str, object]
) -> dict[str, launch_pb2.Scalar]:
    """Type each named value by the pipeline's declaration; unknown names are refused here.

    Bounds and missing scalars are the daemon's to judge (it holds the catalog);
    this only decides the wire type of each value and refuses values that type
    cannot hold.
    """
    by_name = {spec.name: spec for spec in specs}
    packed: dict[str, launch_pb2.Scalar] = {}
    for name, value in values.items():
        spec = by_name.get(name)
        if spec is None:
            known = ", ".join(sorted(by_name)) or "none"
            raise _bad(name, f"the pipeline has no such scalar (it takes: {known})")
        packed[name] = _pack(spec, value)
    return packed
