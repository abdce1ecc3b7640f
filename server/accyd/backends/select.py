"""Choosing a backend: ``auto`` takes CUDA where a GPU is present and the host backend otherwise."""

from __future__ import annotations

from pathlib import Path

from accyd.backends.base import Backend
from accyd.backends.host import HostBackend
from accyd.errors import UnsupportedOperation

__all__ = ["BACKEND_CHOICES", "cuda_present", "make_backend"]

BACKEND_CHOICES = ("auto", "cuda", "host")


def cuda_present() -> bool:
    """True when cuda-python is installed and the driver sees at least one GPU."""
    try:
        from accyd.backends.cuda import cuda_available
    except ImportError:
        return False
    return cuda_available()


def make_backend(
    kind: str = "auto",
    *,
    device: int = 0,
    cache_dir: Path | None = None,
    host_memory_limit: int | None = None,
) -> Backend:
    """Make the backend ``kind`` names; ``auto`` never fails for want of a GPU.

    ``host_memory_limit``: the host backend's limit (``None``: its default share)."""
    if kind not in BACKEND_CHOICES:
        raise UnsupportedOperation(
            f"unknown backend {kind!r}; choose one of {', '.join(BACKEND_CHOICES)}"
        )
    if kind == "host" or (kind == "auto" and not cuda_present()):
        return HostBackend(memory_limit=host_memory_limit)
    if not cuda_present():
        raise UnsupportedOperation(
            "the cuda backend needs an NVIDIA GPU, its driver and cuda-bindings "
            "(pip install 'accy[cuda]'); use --backend host or auto"
        )
    from accyd.backends.cuda import CudaBackend

    return CudaBackend(device_ordinal=device, cache_dir=cache_dir)
