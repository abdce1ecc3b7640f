"""The one checkpoint between cuda-python and the domain: every CUresult and nvrtcResult."""

from __future__ import annotations

import functools
import importlib
import threading
from typing import Any

from accyd.errors import (
    AccyError,
    DeviceFault,
    OutOfMemory,
    RuntimeUnavailable,
)

__all__ = [
    "DEVICE_FAULTS",
    "STICKY_ERROR_NAMES",
    "ErrorCheck",
    "check",
    "check_nvrtc",
    "cuda_driver",
    "describe",
    "device_fault",
    "nvrtc_module",
    "program_log",
]

STICKY_ERROR_NAMES = frozenset(
    {
        "CUDA_ERROR_ECC_UNCORRECTABLE",
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "CUDA_ERROR_LAUNCH_TIMEOUT",
        "CUDA_ERROR_ASSERT",
        "CUDA_ERROR_HARDWARE_STACK_ERROR",
        "CUDA_ERROR_ILLEGAL_INSTRUCTION",
        "CUDA_ERROR_MISALIGNED_ADDRESS",
        "CUDA_ERROR_INVALID_ADDRESS_SPACE",
        "CUDA_ERROR_INVALID_PC",
        "CUDA_ERROR_LAUNCH_FAILED",
        "CUDA_ERROR_TENSOR_MEMORY_LEAK",
        "CUDA_ERROR_CONTAINED",
        "CUDA_ERROR_NVLINK_UNCORRECTABLE",
        "CUDA_ERROR_EXTERNAL_DEVICE",
        "CUDA_ERROR_CONTEXT_IS_DESTROYED",
        "CUDA_ERROR_DEINITIALIZED",
        "CUDA_ERROR_UNKNOWN",
    }
)
"""Errors after which the context is unusable: CUDA documents that the process must restart."""

_OUT_OF_MEMORY = 2  # CUDA_ERROR_OUT_OF_MEMORY

# A sticky error poisons the device's primary context for the whole process, so the
# record of it is per device ordinal and shared by every backend object on that device.
DEVICE_FAULTS: dict[int, str] = {}
_FAULTS_LOCK = threading.Lock()


@functools.cache
def cuda_driver() -> Any:
    """``cuda.bindings.driver``, or ``RuntimeUnavailable`` when cuda-python is not installed."""
    try:
        return importlib.import_module("cuda.bindings.driver")
    except ImportError as error:
        raise RuntimeUnavailable(f"cuda-python (cuda-bindings) is not installed: {error}") from None


@functools.cache
def nvrtc_module() -> Any:
    """``cuda.bindings.nvrtc``; importing it does not yet load libnvrtc."""
    try:
        return importlib.import_module("cuda.bindings.nvrtc")
    except ImportError as error:
        raise RuntimeUnavailable(f"cuda-python (cuda-bindings) is not installed: {error}") from None


@functools.cache
def _sticky_codes() -> frozenset[int]:
    result = cuda_driver().CUresult
    return frozenset(
        int(getattr(result, name)) for name in STICKY_ERROR_NAMES if hasattr(result, name)
    )


def describe(err: Any) -> str:
    """``NAME (code): description`` of a CUresult."""
    cu = cuda_driver()
    code = int(err)
    try:
        _, name = cu.cuGetErrorName(err)
        _, text = cu.cuGetErrorString(err)
        name_s = name.decode() if isinstance(name, bytes) else str(name)
        text_s = text.decode() if isinstance(text, bytes) else str(text)
    except Exception:
        return f"CUresult {code}"
    return f"{name_s} ({code}): {text_s}"


def device_fault(ordinal: int) -> str | None:
    """The first sticky error seen on device ``ordinal`` in this process, if any."""
    return DEVICE_FAULTS.get(ordinal)


def _unwrap(result: Any) -> Any:
    count = len(result)
    if count == 1:
        return None
    if count == 2:
        return result[1]
    return tuple(result[1:])


class ErrorCheck:
    """Turns one device's driver results into values or typed domain errors.

    A sticky error (illegal address and the like) marks the device poisoned for the
    whole process: from then on ``healthy()`` and every check raise ``DeviceFault``.
    """

    __slots__ = ("label", "ordinal")

    def __init__(self, ordinal: int, label: str) -> None:
        self.ordinal = ordinal
        self.label = label

    @property
    def fault(self) -> str | None:
        return DEVICE_FAULTS.get(self.ordinal)

    def healthy(self) -> None:
        """Raise ``DeviceFault`` if the device was poisoned earlier in this process."""
        fault = DEVICE_FAULTS.get(self.ordinal)
        if fault is not None:
            raise DeviceFault(
                f"{self.label} is lost after a sticky error ({fault}); the process must restart"
            )

    def __call__(
        self, result: Any, what: str, failure: type[AccyError] = RuntimeUnavailable
    ) -> Any:
        """The call's value(s) when ``result[0]`` is CUDA_SUCCESS, else the mapped error."""
        err = result[0]
        if err:
            raise self.error(err, what, failure)
        return _unwrap(result)

    def error(
        self, err: Any, what: str, failure: type[AccyError] = RuntimeUnavailable
    ) -> AccyError:
        """The domain error for a failed call; records a sticky error as the device's fault."""
        code = int(err)
        message = f"{what} failed on {self.label}: {describe(err)}"
        if code in _sticky_codes():
            with _FAULTS_LOCK:
                DEVICE_FAULTS.setdefault(self.ordinal, message)
            return DeviceFault(f"{message}; the context is poisoned and the process must restart")
        fault = DEVICE_FAULTS.get(self.ordinal)
        if fault is not None:
            return DeviceFault(f"{message}, after a sticky error ({fault})")
        if code == _OUT_OF_MEMORY:
            return OutOfMemory(message)
        return failure(message)


def check(result: Any, what: str, failure: type[AccyError] = RuntimeUnavailable) -> Any:
    """Like ``ErrorCheck`` for calls that belong to no device (cuInit, device queries)."""
    err = result[0]
    if err:
        code = int(err)
        message = f"{what} failed: {describe(err)}"
        if code == _OUT_OF_MEMORY:
            raise OutOfMemory(message)
        raise failure(message)
    return _unwrap(result)


def check_nvrtc(result: Any, what: str, program: Any = None) -> Any:
    """The value(s) of an NVRTC call, or ``RuntimeUnavailable`` naming the program's log."""
    err = result[0]
    if err:
        rtc = nvrtc_module()
        try:
            _, name = rtc.nvrtcGetErrorString(err)
            name_s = name.decode() if isinstance(name, bytes) else str(name)
        except Exception:
            name_s = f"nvrtcResult {int(err)}"
        log = program_log(program) if program is not None else ""
        detail = f"\nNVRTC log:\n{log}" if log else ""
        raise RuntimeUnavailable(f"{what} failed: {name_s}{detail}")
    return _unwrap(result)


def program_log(program: Any) -> str:
    """An NVRTC program's compile log, or '' when it cannot be read."""
    rtc = nvrtc_module()
    try:
        err, size = rtc.nvrtcGetProgramLogSize(program)
        if err or size <= 1:
            return ""
        buffer = b" " * size
        (err,) = rtc.nvrtcGetProgramLog(program, buffer)
        if err:
            return ""
        return bytes(buffer).rstrip(b"\0").decode(errors="replace").strip()
    except Exception:
        return ""
