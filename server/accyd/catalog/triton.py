"""Triton-lang kernels as Triton's compiler writes them: a cubin and its JSON metadata.

``triton.compile`` (no GPU needed) leaves ``NAME.cubin`` and ``NAME.json`` in its cache
folder, or ``kernel.asm["cubin"]`` and ``kernel.metadata``: the metadata says how the
kernel must be launched. Its block is ``32 x num_warps`` threads, its dynamic shared
memory ``shared`` bytes, and since Triton 3.3 the kernel takes two pointers after the
user's parameters (global scratch and profile scratch; null where their sizes are 0).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from accyd.catalog.entries import Param, ParamKind

__all__ = ["TritonMetadata", "parse_metadata"]

MAX_METADATA_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class TritonMetadata:
    """What accy takes from a Triton kernel's metadata."""

    name: str
    num_warps: int
    shared: int
    arch: int
    hidden: tuple[Param, ...]
    """The parameters Triton appends after the user's, each a null pointer."""

    @property
    def block(self) -> tuple[int, int, int]:
        return (32 * self.num_warps, 1, 1)


def _int(data: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = data.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"the metadata's {key!r} is {value!r}, not a non-negative integer")
    return value


def parse_metadata(text: bytes) -> TritonMetadata:
    """Read Triton's metadata; ``ValueError`` saying what accy cannot launch as written."""
    if len(text) > MAX_METADATA_BYTES:
        raise ValueError(f"Triton metadata is over {MAX_METADATA_BYTES} bytes")
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"is not Triton's JSON metadata: {error}") from None
    if not isinstance(data, dict):
        raise ValueError("is not Triton's JSON metadata (not an object)")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("Triton's metadata names no kernel ('name')")
    target = data.get("target")
    backend = target.get("backend") if isinstance(target, dict) else data.get("backend_name")
    if backend != "cuda":
        raise ValueError(f"the kernel was built for {backend!r}, not 'cuda'")
    arch = _int(target, "arch") if isinstance(target, dict) else 0
    num_warps = _int(data, "num_warps")
    if not 1 <= num_warps <= 32:
        raise ValueError(f"num_warps is {num_warps}; a block holds 1 to 32 warps")
    if _int(data, "num_ctas", 1) != 1:
        raise ValueError(
            "num_ctas is above 1 (a cluster launch), which accy does not launch yet; "
            "compile with num_ctas=1"
        )
    if data.get("launch_cooperative_grid"):
        raise ValueError("the kernel needs a cooperative launch, which accy does not make")
    hidden = []
    for kind in ("global_scratch", "profile_scratch"):
        if f"{kind}_size" not in data:
            continue  # Triton before 3.3 (global) or 3.5 (profile) has no such parameter
        size = _int(data, f"{kind}_size")
        if size:
            raise ValueError(
                f"the kernel needs {size} bytes of {kind.replace('_', ' ')} per program, "
                "which accy does not supply yet (kernels using on-device tensor descriptors "
                "or the profiler need it)"
            )
        hidden.append(Param(ParamKind.NULL, kind))
    return TritonMetadata(name, num_warps, _int(data, "shared", 0), arch, tuple(hidden))
