"""The element types of the protocol: each one's name, its wire enum and its numpy dtype."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from accy.protocol.launch.v1 import launch_pb2

__all__ = ["DTYPES", "WireDType", "dtype_named", "dtype_of_numpy", "dtype_of_wire"]


@dataclass(frozen=True, slots=True)
class WireDType:
    """One element type: ``name`` as manifests, the CLI and ``Scalar`` fields spell it."""

    name: str
    wire: launch_pb2.DType
    numpy: np.dtype[Any]
    """Little-endian, as buffers hold it on the wire (``ml_dtypes`` for bf16 and fp8)."""
    scalar: bool
    """Whether a runtime scalar can carry it (``Scalar`` has a field of this name)."""
    record_code: str
    """The ``struct`` code of its value in a ring record's 8-byte scalar field ('' if none)."""

    @property
    def is_integer(self) -> bool:
        return self.name[0] in "iu"

    @property
    def is_float(self) -> bool:
        return self.name[0] in "fb" and self.name != "bool"

    @property
    def range(self) -> tuple[float, float]:
        """The smallest and largest value it holds (finite ones, for floating point)."""
        if self.name == "bool":
            return (0, 1)
        if self.is_integer:
            info = np.iinfo(self.numpy)
            return (int(info.min), int(info.max))
        largest = float(ml_dtypes.finfo(self.numpy).max)  # type: ignore[no-untyped-call]
        return (-largest, largest)


_SCALAR_FIELDS = frozenset(launch_pb2.DESCRIPTOR.message_types_by_name["Scalar"].fields_by_name)


def _entry(name: str, wire: launch_pb2.DType, numpy: Any, record_code: str = "") -> WireDType:
    scalar = name in _SCALAR_FIELDS and bool(record_code)
    return WireDType(name, wire, np.dtype(numpy).newbyteorder("<"), scalar, record_code)


DTYPES: tuple[WireDType, ...] = (
    _entry("f32", launch_pb2.DTYPE_F32, np.float32, "f4x"),
    _entry("f64", launch_pb2.DTYPE_F64, np.float64, "d"),
    _entry("i32", launch_pb2.DTYPE_I32, np.int32, "i4x"),
    _entry("u32", launch_pb2.DTYPE_U32, np.uint32, "I4x"),
    _entry("i64", launch_pb2.DTYPE_I64, np.int64, "q"),
    _entry("u64", launch_pb2.DTYPE_U64, np.uint64, "Q"),
    _entry("u8", launch_pb2.DTYPE_U8, np.uint8, "B7x"),
    _entry("f16", launch_pb2.DTYPE_F16, np.float16, "e6x"),
    _entry("bf16", launch_pb2.DTYPE_BF16, ml_dtypes.bfloat16),
    _entry("f8e4m3", launch_pb2.DTYPE_F8E4M3, ml_dtypes.float8_e4m3fn),
    _entry("f8e5m2", launch_pb2.DTYPE_F8E5M2, ml_dtypes.float8_e5m2),
    _entry("i8", launch_pb2.DTYPE_I8, np.int8, "b7x"),
    _entry("i16", launch_pb2.DTYPE_I16, np.int16, "h6x"),
    _entry("u16", launch_pb2.DTYPE_U16, np.uint16, "H6x"),
    _entry("bool", launch_pb2.DTYPE_BOOL, np.bool_),
)
"""Every element type; ``DTYPE_UNSPECIFIED`` (an untyped buffer) is none of them.

bf16, fp8 and bool buffers are served; as runtime scalars they are not (a kernel takes
an f32 and converts), so the protocol's ``Scalar`` has no field for them."""

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
