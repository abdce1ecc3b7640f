"""Typed scalars: a value is refused unless the type it is packed as holds it."""

from __future__ import annotations

import math

import pytest

from accyd.catalog import load_catalog
from accyd.catalog.dtypes import DType, Scalar
from accyd.core.sessions import order_scalars
from accyd.errors import LaunchArgumentMismatch


@pytest.mark.parametrize("value", [1e300, -1e39, 3.5e38])
def test_an_f32_scalar_too_large_for_f32_is_refused(value: float) -> None:
    with pytest.raises(LaunchArgumentMismatch, match="does not fit f32"):
        Scalar(DType.F32, value)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_inf_and_nan_are_refused(value: float) -> None:
    for dtype in (DType.F32, DType.F64):
        with pytest.raises(LaunchArgumentMismatch, match="finite"):
            Scalar(dtype, value)


def test_values_that_fit_keep_their_value() -> None:
    assert Scalar(DType.F32, 3.4e38).value == 3.4e38
    assert Scalar(DType.F64, 1e300).value == 1e300
    assert Scalar(DType.F32, 1.5).to_bytes() == Scalar(DType.F32, 1.5).to_bytes()


def test_an_f64_value_given_for_an_f32_scalar_is_refused_naming_the_scalar() -> None:
    saxpy = load_catalog().find_pipeline("accy.kernel.saxpy")
    given = {"n": Scalar(DType.U32, 4), "a": Scalar(DType.F64, 1e300)}
    with pytest.raises(LaunchArgumentMismatch, match=r"'a'.*does not fit f32") as caught:
        order_scalars(saxpy, given)
    assert caught.value.field == "runtime_scalars.a"
