"""A kernel's parameters as the driver lays them out, checked against its manifest at load.

``cuFuncGetParamInfo`` (CUDA 12.4 and later) gives each parameter's offset and size. A
manifest that lists fewer parameters than the kernel takes would have the driver read past
the argument array at every launch; one that lists more, or a size that differs, passes
values the kernel reads as something else. Either is refused before the kernel is used.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import structlog

from accyd.catalog.entries import Param, ParamKind
from accyd.errors import FailedPrecondition

__all__ = ["KernelParameterMismatch", "check_parameters", "driver_parameters"]

_MAX_PARAMS = 4096
_log = structlog.get_logger("accyd.backends")
_warned: list[bool] = []


class KernelParameterMismatch(FailedPrecondition):
    """A manifest whose parameters differ from its kernel's: the catalog's to fix."""


def driver_parameters(cu: Any, function: Any) -> list[tuple[int, int]] | None:
    """(offset, size) of each parameter the function takes; ``None`` where the driver
    cannot say (before CUDA 12.4)."""
    if not hasattr(cu, "cuFuncGetParamInfo"):
        return None
    found: list[tuple[int, int]] = []
    for index in range(_MAX_PARAMS):
        err, offset, size = cu.cuFuncGetParamInfo(function, index)
        if err == cu.CUresult.CUDA_ERROR_INVALID_VALUE:
            return found  # past the last parameter
        if err:
            return None  # CUDA_ERROR_NOT_SUPPORTED and the like: this driver cannot tell
        found.append((int(offset), int(size)))
    return found


def check_parameters(
    cu: Any, function: Any, layout: Sequence[Param], kernel: str, origin: str
) -> None:
    """Refuse ``layout`` unless it matches the function's parameters, one for one."""
    actual = driver_parameters(cu, function)
    if actual is None:
        if not _warned:
            _warned.append(True)
            _log.warning(
                "this CUDA driver cannot report kernel parameter layouts "
                "(cuFuncGetParamInfo, CUDA 12.4+); manifests are not checked against kernels"
            )
        return
    where = f"{origin}: kernel {kernel!r}"
    if len(actual) != len(layout):
        listed = ", ".join(p.describe(i) for i, p in enumerate(layout)) or "none"
        raise KernelParameterMismatch(
            f"{where} takes {len(actual)} parameters; the manifest lists {len(layout)} "
            f"({listed}). Sizes the kernel takes: {[size for _, size in actual]}",
            field="params",
        )
    for index, (param, (_, size)) in enumerate(zip(layout, actual, strict=True)):
        expected = None if param.kind is ParamKind.SCALAR and param.dtype is None else param.size
        if expected is not None and expected != size:
            raise KernelParameterMismatch(
                f"{where}: {param.describe(index)} is {expected} bytes in the manifest; the "
                f"kernel's parameter {index} is {size} bytes",
                field=f"params[{index}]",
            )
