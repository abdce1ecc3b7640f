"""The CUDA backend (cuda-python driver API, NVRTC) and a probe for whether it can run here."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accyd.backends.cuda.backend import CudaBackend

__all__ = ["CudaBackend", "cuda_available"]


@functools.cache
def cuda_available() -> bool:
    """True when cuda-python imports, the driver loads and initializes, and a device exists.

    Never raises: no package, no libcuda, no device or a failed cuInit all give False.
    """
    try:
        from accyd.backends.cuda.driver import cuda_driver

        cu = cuda_driver()
        (err,) = cu.cuInit(0)
        if err:
            return False
        err, count = cu.cuDeviceGetCount()
        return not err and int(count) > 0
    except Exception:
        return False


def __getattr__(name: str) -> Any:
    if name == "CudaBackend":
        from accyd.backends.cuda.backend import CudaBackend

        return CudaBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
