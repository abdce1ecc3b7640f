"""Element types between numpy and the wire, and the names manifests give them."""

from __future__ import annotations

from typing import Any

import numpy as np

from accy.protocol import DTYPES, dtype_named, dtype_of_numpy, dtype_of_wire
from accy.protocol.launch.v1 import launch_pb2

__all__ = [
    "DTypeLike",
    "from_wire",
    "name_of",
    "to_numpy",
    "to_wire",
]

DTypeLike = np.dtype[Any] | type[np.generic] | str


def to_numpy(dtype: DTypeLike) -> np.dtype[Any]:
    """``dtype`` as a little-endian numpy dtype: a numpy dtype or type accy has, or an accy
    name such as ``"f32"``. Any other string is refused, never read as numpy would read it
    (numpy's ``"i8"`` is int64 and its ``"f8"`` float64; accy's ``"i8"`` is int8)."""
    if isinstance(dtype, str):
        named = dtype_named(dtype)
        if named is None:
            names = ", ".join(e.name for e in DTYPES)
            raise TypeError(f"unknown dtype {dtype!r}; accy's dtypes are {names}")
        return named.numpy
    resolved = np.dtype(dtype).newbyteorder("<")
    entry = dtype_of_numpy(resolved)
    if entry is None:
        names = ", ".join(f"{e.numpy} ({e.name})" for e in DTYPES)
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
