"""Scalar typing from a pipeline's declaration, dtype mapping, and extent expressions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accy import _dtypes, _extent, _scalars
from accy._models import ScalarSpec
from accy.errors import InvalidArgument
from accy.protocol.launch.v1 import launch_pb2 as pb

SPECS = (
    ScalarSpec("n", np.dtype(np.uint32), 1, 2**30),
    ScalarSpec("a", np.dtype(np.float32), None, None),
    ScalarSpec("k", np.dtype(np.int64), None, None),
    ScalarSpec("d", np.dtype(np.float64), None, None),
)


def test_each_value_takes_its_declared_wire_type() -> None:
    packed = _scalars.pack_scalars(SPECS, {"n": 5, "a": 2, "k": -3, "d": np.float64(0.5)})
    kinds = {name: s.WhichOneof("value") for name, s in packed.items()}
    assert kinds == {"n": "u32", "a": "f32", "k": "i64", "d": "f64"}
    assert packed["a"].f32 == 2.0 and packed["k"].i64 == -3


@settings(deadline=None)  # timing under a loaded machine is not the property
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_u32_accepts_its_whole_range(value: int) -> None:
    assert _scalars.pack_scalars(SPECS, {"n": value})["n"].u32 == value


@settings(deadline=None)  # timing under a loaded machine is not the property
@given(st.one_of(st.integers(max_value=-1), st.integers(min_value=2**32)))
def test_u32_refuses_what_it_cannot_hold(value: int) -> None:
    with pytest.raises(InvalidArgument) as caught:
        _scalars.pack_scalars(SPECS, {"n": value})
    assert caught.value.fields == ("runtime_scalars[n]",)


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        ("n", 1.0, "expected an integer"),
        ("n", True, "boolean"),
        ("a", "1", "expected a number"),
        ("a", 1e39, "not a finite f32"),
        ("d", float("nan"), "not a finite f64"),
        ("zz", 1, "no such scalar"),
    ],
)
def test_refusals(name: str, value: object, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        _scalars.pack_scalars(SPECS, {name: value})


def test_dtype_mapping_round_trips() -> None:
    for wire in (
        pb.DTYPE_F32,
        pb.DTYPE_F64,
        pb.DTYPE_I32,
        pb.DTYPE_U32,
        pb.DTYPE_I64,
        pb.DTYPE_U64,
        pb.DTYPE_U8,
    ):
        dtype = _dtypes.from_wire(wire)
        assert dtype is not None and _dtypes.to_wire(dtype) == wire
    assert _dtypes.to_numpy("f32") == np.float32
    assert _dtypes.to_numpy(np.dtype(">f4")) == np.dtype("<f4")
    assert _dtypes.from_wire(pb.DTYPE_UNSPECIFIED) is None
    assert _dtypes.to_wire(None) == pb.DTYPE_UNSPECIFIED
    with pytest.raises(TypeError, match="no accy dtype"):
        _dtypes.to_numpy(np.complex64)


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("n", 10),
        ("ceil_div(n, 4)", 3),
        ("rows * cols", 6),
        ("n + 1", 11),
        ("2 * n - 1", 19),
        ("7", 7),
    ],
)
def test_extents(expression: str, value: int) -> None:
    assert _extent.evaluate(expression, {"n": 10, "rows": 2, "cols": 3}) == value


def test_extent_errors_and_names() -> None:
    with pytest.raises(_extent.ExtentError, match="needs the scalar 'm'"):
        _extent.evaluate("m", {"n": 1})
    with pytest.raises(_extent.ExtentError, match="cannot read"):
        _extent.evaluate("n ** 2", {"n": 1})
    with pytest.raises(_extent.ExtentError, match="cannot read"):
        _extent.evaluate("n +", {"n": 1})
    with pytest.raises(_extent.ExtentError, match="divides by 0"):
        _extent.evaluate("ceil_div(n, 0)", {"n": 1})
    assert _extent.names("ceil_div(n, 64) * rows") == {"n", "rows"}
