"""A table driver's ``patch``: the engine's call hands the launch a record's free scalars,
a failure is kept for ``error`` (never raised into the engine), and a launch that is gone
is never patched, even where its handle names another launch now."""

from __future__ import annotations

import ctypes
import gc
import struct
from collections.abc import Sequence

from accyd.backends.base import ScalarChange, Stream
from accyd.backends.host import HostBackend
from accyd.catalog.dtypes import DType, Scalar
from accyd.errors import LaunchArgumentMismatch, LaunchFailed
from accyd.ring.engine.drivers import CALLBACK_ERROR, SCALAR_BYTES, PythonDriver

_PATCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint32)


class Launch:
    """A prepared launch that records what it was given."""

    def __init__(self) -> None:
        self.given: list[list[ScalarChange]] = []

    def launch(self, stream: Stream | None, count: int = 1) -> None:
        raise AssertionError("not launched here")

    def set_scalars(self, changes: Sequence[ScalarChange]) -> None:
        self.given.append(list(changes))

    def close(self) -> None:
        pass


def read_a(raw: bytes) -> list[ScalarChange]:
    """Field 1 as an f32, to stage 0's argument 2 (``Scalar`` checks it)."""
    return [(0, 2, Scalar(DType.F32, struct.unpack_from("<f", raw, 8)[0]))]


def call_patch(driver: PythonDriver, handle: int, a: float) -> int:
    raw = ctypes.create_string_buffer(struct.pack("<I4xf4x", 7, a).ljust(SCALAR_BYTES, b"\0"))
    patch = _PATCH(driver.table()["patch"])
    return int(patch(handle, ctypes.addressof(raw), 0b10))


def test_a_patch_hands_the_launch_the_records_values() -> None:
    driver = PythonDriver(HostBackend())
    launch = Launch()
    handle = driver.exec_handle(launch, read_a)  # type: ignore[arg-type]
    assert call_patch(driver, handle, 2.5) == 0
    assert launch.given == [[(0, 2, Scalar(DType.F32, 2.5))]]


def test_a_value_its_type_refuses_is_kept_for_the_engines_report() -> None:
    driver = PythonDriver(HostBackend())
    launch = Launch()
    handle = driver.exec_handle(launch, read_a)  # type: ignore[arg-type]
    assert call_patch(driver, handle, float("inf")) == CALLBACK_ERROR
    assert launch.given == []
    error = driver.error(CALLBACK_ERROR, "cuGraphLaunch")
    assert isinstance(error, LaunchArgumentMismatch) and "finite" in str(error)


def test_a_launch_that_is_gone_is_never_patched() -> None:
    driver = PythonDriver(HostBackend())
    launch = Launch()
    handle = driver.exec_handle(launch, read_a)  # type: ignore[arg-type]
    del launch
    gc.collect()
    assert call_patch(driver, handle, 1.0) == CALLBACK_ERROR
    assert isinstance(driver.error(CALLBACK_ERROR, "cuGraphLaunch"), LaunchFailed)
