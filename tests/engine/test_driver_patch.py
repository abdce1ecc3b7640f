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
from accyd.catalog import load_catalog
from accyd.catalog.dtypes import DType, Scalar
from accyd.catalog.model import ArtifactFormat
from accyd.core.free_scalars import free_scalars_of
from accyd.core.tickets import FastLaunch
from accyd.errors import LaunchArgumentMismatch, LaunchFailed
from accyd.ring.engine.drivers import CALLBACK_ERROR, SCALAR_BYTES, PythonDriver, engine_ticket

HOST_PY = ArtifactFormat.HOST_PY
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


def test_a_ticket_is_patched_only_where_asked_and_else_exact_and_the_devices_too() -> None:
    driver = PythonDriver(HostBackend())
    launch = Launch()
    catalog = load_catalog()
    free = free_scalars_of(catalog.find_pipeline("accy.kernel.saxpy"), catalog.registry, HOST_PY)
    assert free is not None
    fast = FastLaunch("ses", launch, None, 0, 1, 7, free)  # type: ignore[arg-type]
    key = bytes(range(136))
    exact, device_too = engine_ticket(driver, fast, key, 5, 3, patch=False)
    assert exact == (key, 0, exact[2], 5, 3, 1, 7) and device_too
    masked, device_too = engine_ticket(driver, fast, key, 5, 3, patch=True)
    assert len(masked) == 8 and not device_too
    a_at = 84 - 12 + 8 * 1  # saxpy's a is scalar 1
    assert masked[0] == key[:a_at] + bytes(8) + key[a_at + 8 :]
    assert masked[7] == (0b10, bytes([0, 4, 0, 0, 0, 0, 0, 0]), (0, 0x7F800000, 0, 0, 0, 0, 0, 0))
