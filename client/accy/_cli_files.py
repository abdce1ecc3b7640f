"""``accy run``'s files: operands read from ``.npy`` files, results written as ``.npy``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from accy._dtypes import name_of
from accy._models import PipelineInfo

__all__ = ["FileError", "read_inputs", "write_outputs"]


class FileError(ValueError):
    """An ``--input`` or ``--output`` that does not fit the pipeline or cannot be used."""


def read_inputs(
    info: PipelineInfo, given: Sequence[tuple[str, str]]
) -> dict[str, np.ndarray[Any, Any]]:
    """Each ``NAME=FILE.npy`` as the array of operand NAME, of the operand's dtype."""
    operands = {spec.name: spec for spec in info.operands}
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    for name, path in given:
        spec = operands.get(name)
        if spec is None:
            names = ", ".join(operands) or "none"
            raise FileError(f"--input {name}=...: {info.target} has no operand {name!r} ({names})")
        if name in arrays:
            raise FileError(f"--input {name}=... is given twice")
        try:
            array = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as error:
            raise FileError(f"--input {name}={path}: cannot read it as .npy ({error})") from None
        if spec.dtype is not None and array.dtype.newbyteorder("<") != spec.dtype:
            raise FileError(
                f"--input {name}={path} holds {array.dtype}; {info.target} takes "
                f"{name_of(spec.dtype)} (save it as that type)"
            )
        arrays[name] = np.ascontiguousarray(array)
    return arrays


def write_outputs(
    info: PipelineInfo,
    results: Sequence[np.ndarray[Any, Any]],
    scalars: Mapping[str, float],
    folder: Path,
) -> list[Path]:
    """Each result as ``FOLDER/NAME.npy``, in its declared shape; the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for spec, flat in zip(info.results, results, strict=True):
        path = folder / f"{spec.name}.npy"
        np.save(path, spec.shaped(flat, scalars), allow_pickle=False)
        written.append(path)
    return written
