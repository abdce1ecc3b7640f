"""Element types of buffers and scalars, and typed scalar values."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

from accy.protocol import WireDType, dtype_named
from accyd.errors import LaunchArgumentMismatch

__all__ = ["DType", "Scalar"]


class DType(enum.Enum):
    """An element type, named as manifests and the wire protocol name it."""

    F32 = "f32"
    F64 = "f64"
    I32 = "i32"
    U32 = "u32"
    I64 = "i64"
    U64 = "u64"
    U8 = "u8"
    F16 = "f16"
    BF16 = "bf16"
    F8E4M3 = "f8e4m3"
    F8E5M2 = "f8e5m2"
    I8 = "i8"
    I16 = "i16"
    U16 = "u16"
    BOOL = "bool"

    @property
    def numpy(self) -> np.dtype[np.generic]:
        return _NUMPY_DTYPES[self]

    @property
    def itemsize(self) -> int:
        return _NUMPY_DTYPES[self].itemsize

    @property
    def is_integer(self) -> bool:
        return self in _INT_RANGES

    @property
    def is_scalar(self) -> bool:
        """Whether a runtime scalar may have this type (bf16, fp8 and bool may not)."""
        return _WIRE[self].scalar

    @classmethod
    def parse(cls, name: str) -> DType:
        try:
            return cls(name)
        except ValueError:
            names = ", ".join(d.value for d in cls)
            raise ValueError(f"unknown dtype {name!r}; expected one of {names}") from None

    @classmethod
    def from_numpy(cls, dtype: np.dtype[np.generic]) -> DType:
        for member, numpy in _NUMPY_DTYPES.items():
            if numpy == dtype:
                return member
        raise ValueError(f"numpy dtype {dtype} has no accy dtype")

    def check_value(self, value: int | float) -> int | float:
        """Return ``value`` as this type holds it, or raise if it does not fit."""
        if self.is_integer:
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise LaunchArgumentMismatch(f"expected an integer for {self.value}, got {value!r}")
            low, high = _INT_RANGES[self]
            ivalue = int(value)
            if not low <= ivalue <= high:
                raise LaunchArgumentMismatch(f"{ivalue} does not fit {self.value} ({low}..{high})")
            return ivalue
        if self not in _FLOAT_MAX:
            raise LaunchArgumentMismatch(f"{self.value} values cannot be runtime scalars")
        if isinstance(value, bool) or not isinstance(value, int | float | np.number):
            raise LaunchArgumentMismatch(f"expected a number for {self.value}, got {value!r}")
        fvalue = float(value)
        if not math.isfinite(fvalue):
            raise LaunchArgumentMismatch(f"{self.value} scalar must be finite, got {fvalue}")
        largest = _FLOAT_MAX[self]
        if abs(fvalue) > largest:
            # Packed as this type it would become inf, and a kernel would run on it.
            raise LaunchArgumentMismatch(
                f"{fvalue!r} does not fit {self.value} (largest magnitude {largest:.7g})"
            )
        return fvalue


def _wire(dtype: DType) -> WireDType:
    entry = dtype_named(dtype.value)
    if entry is None:
        raise AssertionError(f"the protocol has no element type {dtype.value}")
    return entry


_WIRE: dict[DType, WireDType] = {d: _wire(d) for d in DType}
_NUMPY_DTYPES: dict[DType, np.dtype[np.generic]] = {d: w.numpy for d, w in _WIRE.items()}
_INT_RANGES: dict[DType, tuple[int, int]] = {
    d: (int(w.range[0]), int(w.range[1])) for d, w in _WIRE.items() if w.is_integer
}
_FLOAT_MAX: dict[DType, float] = {d: w.range[1] for d, w in _WIRE.items() if w.is_float}


@dataclass(frozen=True, slots=True)
class Scalar:
    """A runtime or derived scalar argument: a value tagged with its type."""

    dtype: DType
    value: int | float

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", self.dtype.check_value(self.value))

    @classmethod
    def u32(cls, value: int) -> Scalar:
        return cls(DType.U32, value)

    @classmethod
    def i32(cls, value: int) -> Scalar:
        return cls(DType.I32, value)

    @classmethod
    def f32(cls, value: float) -> Scalar:
        return cls(DType.F32, value)

    def to_bytes(self) -> bytes:
        """The value packed as the kernel receives it (little-endian, natural size)."""
        return np.array(self.value, dtype=self.dtype.numpy).tobytes()

    def same_as(self, other: Scalar) -> bool:
        """Whether a kernel receives the same bytes (``-0.0`` is not ``0.0``; values are
        finite, so no NaN)."""
        if self.dtype is not other.dtype or self.value != other.value:
            return False
        if isinstance(self.value, float):
            return math.copysign(1.0, self.value) == math.copysign(1.0, other.value)
        return True
