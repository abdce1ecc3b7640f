"""The CUDA device runtime's static library, and linking relocatable device code with it.

Code that launches graphs from the device (``cudaGraphLaunch`` in a kernel: the device
launcher) is compiled as relocatable code (NVRTC ``-rdc=true``) and linked with
``libcudadevrt.a`` by the driver's linker; the library comes with the CUDA runtime's wheel
(or a toolkit), found by ``cuda.pathfinder``. No nvcc is needed.
"""

from __future__ import annotations

import ctypes
import importlib
from collections.abc import Callable
from typing import Any

from accyd.errors import RuntimeUnavailable

__all__ = ["find_devrt", "link_devrt"]


def find_devrt() -> str:
    """The path of ``libcudadevrt.a`` (the CUDA runtime wheel's, or a toolkit's)."""
    try:
        pathfinder: Any = importlib.import_module("cuda.pathfinder")
        return str(pathfinder.find_static_lib("cudadevrt"))
    except Exception as error:  # not installed, or a pathfinder without the call
        raise RuntimeUnavailable(f"libcudadevrt.a is not found: {error}") from None


def link_devrt(cu: Any, check: Callable[..., Any], image: bytes, kind: str, devrt: str) -> bytes:
    """A relocatable ``image`` (``cubin`` or ``ptx``) linked with ``devrt`` by the driver's
    linker: a cubin that can be loaded and may launch graphs from the device."""
    state = check(cu.cuLinkCreate(0, [], []), "cuLinkCreate")
    try:
        jit = cu.CUjitInputType
        input_kind = jit.CU_JIT_INPUT_CUBIN if kind == "cubin" else jit.CU_JIT_INPUT_PTX
        check(
            cu.cuLinkAddData(state, input_kind, image, len(image), b"launcher", 0, [], []),
            "cuLinkAddData",
        )
        check(
            cu.cuLinkAddFile(state, jit.CU_JIT_INPUT_LIBRARY, devrt.encode(), 0, [], []),
            "cuLinkAddFile(libcudadevrt.a)",
        )
        address, size = check(cu.cuLinkComplete(state), "cuLinkComplete")
        return ctypes.string_at(int(address), int(size))
    finally:
        cu.cuLinkDestroy(state)
