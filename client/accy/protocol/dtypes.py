"""The element types of the protocol: each one's name, its wire enum and its numpy dtype."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from accy.protocol.launch.v1 import launch_pb2

__all__ = ["DTYPES", "WireDType", "dtype_named", "dtype_of_numpy", "dtype_of_wire"]


@dataclass(frozen=True, slots=True)
class WireDType:
    """One element type: ``name`` as manifests, the CLI and ``Scalar`` fields spell it."""

    name: str
    wire: launch_pb2.DType
    numpy: np.dtype[Any]
    """Little-endian, as buffers hold it on the wire."""
    scalar: bool
    """Whether a runtime scalar can carry it (``Scalar`` has a field of this name)."""


_SCALAR_FIELDS = frozenset(launch_pb2.DESCRIPTOR.message_types_by_name["Scalar"].fields_by_name)


def _entry(name: str, wire: launch_pb2.DType, numpy: type[np.generic]) -> WireDType:
    return WireDType(name, wire, np.dtype(numpy).newbyteorder("<"), name in _SCALAR_FIELDS)


DTYPES: tuple[WireDType, ...] = (
    _entry("f32", launch_pb2.DTYPE_F32, np.float32),
    _entry("f64", launch_pb2.DTYPE_F64, np.float64),
    _entry("i32", launch_pb2.DTYPE_I32, np.int32),
    _entry("u32", launch_pb2.DTYPE_U32, np.uint32),
    _entry("i64", launch_pb2.DTYPE_I64, np.int64),
    _entry("u64", launch_pb2.DTYPE_U64, np.uint64),
    _entry("u8", launch_pb2.DTYPE_U8, np.uint8),
)
"""Every element type; ``DTYPE_UNSPECIFIED`` (an untyped buffer) is none of them."""

_BY_NAME = {d.name: d for d in DTYPES}
_BY_WIRE = {int(d.wire): d for d in DTYPES}
_BY_NUMPY = {d.numpy: d for d in DTYPES}


def dtype_named(name: str) -> WireDType | None:
    """The element type called ``name`` (``"f32"``), if there is one."""
    return _BY_NAME.get(name)


def dtype_of_wire(wire: int) -> WireDType | None:
    """The element type of a wire enum value (``None`` for unspecified or unknown values)."""
    return _BY_WIRE.get(wire)


def dtype_of_numpy(dtype: np.dtype[Any]) -> WireDType | None:
    """The element type of a numpy dtype (byte order aside), if accy has one."""
    return _BY_NUMPY.get(dtype.newbyteorder("<"))
