"""CUDA C++ as a manifest gives it: the headers it includes from beside it, and its options.

Headers are read when the manifest is read and handed to NVRTC in memory, so a compile
never reads the catalog's folder again and the compile cache's key covers their text.
Options come from an allow-list: macros, fast math, precision switches, a register limit,
the language standard, line info; the architecture and include paths are the daemon's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

__all__ = ["MAX_HEADERS", "MAX_HEADER_BYTES", "check_options", "local_headers"]

MAX_HEADERS = 64
MAX_HEADER_BYTES = 4 * 2**20
"""The most header files, and bytes of them, one kernel may include from its folder."""

_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*"([^"\n]+)"', re.MULTILINE)

_OPTIONS = (
    re.compile(r"(-D|--define-macro=)[A-Za-z_][A-Za-z0-9_]*(=[^\s]*)?"),
    re.compile(r"(-U|--undefine-macro=)[A-Za-z_][A-Za-z0-9_]*"),
    re.compile(r"-?-use_fast_math"),
    re.compile(r"--(ftz|prec-div|prec-sqrt|fmad)=(true|false)"),
    re.compile(r"--maxrregcount=([1-9][0-9]{0,2})"),
    re.compile(r"-?-std=c\+\+(11|14|17|20)"),
    re.compile(r"--extra-device-vectorization|-lineinfo|--generate-line-info"),
    re.compile(r"--dopt=(on|off)|-default-device|--restrict|-restrict"),
)
"""The NVRTC options a manifest may give, each matched whole."""


def check_options(options: Sequence[str]) -> tuple[str, ...]:
    """The options if each is allowed; ``ValueError`` naming the first that is not."""
    for option in options:
        if not any(pattern.fullmatch(option) for pattern in _OPTIONS):
            raise ValueError(
                f"option {option!r} is not allowed; a manifest may give -D/-U macros, "
                "--use_fast_math, --ftz/--prec-div/--prec-sqrt/--fmad=true|false, "
                "--maxrregcount=N, -std=c++NN, -lineinfo, --extra-device-vectorization, "
                "--dopt, -default-device and --restrict (the architecture and include "
                "paths are the daemon's)"
            )
    return tuple(options)


def local_headers(source: bytes, folder: Path) -> tuple[tuple[str, str], ...]:
    """Every header ``source`` includes with quotes, found beside it, as (include name, text),
    following their own includes; a quoted include found nowhere is left to CUDA's headers.

    ``ValueError`` for a header outside ``folder``, one that cannot be read, or more than
    ``MAX_HEADERS`` files or ``MAX_HEADER_BYTES`` bytes.
    """
    root = folder.resolve()
    found: dict[str, str] = {}
    todo = [name.decode(errors="replace") for name in _INCLUDE.findall(source)]
    total = 0
    while todo:
        name = todo.pop()
        if name in found:
            continue
        path = (root / name).resolve()
        if not path.is_relative_to(root):
            raise ValueError(f"header {name!r} is outside the manifest's folder")
        if not path.is_file():
            continue  # a CUDA or system header (cuda_fp16.h), found on NVRTC's include path
        try:
            data = path.read_bytes()
        except OSError as error:
            raise ValueError(f"cannot read header {name!r}: {error.strerror}") from None
        total += len(data)
        if len(found) >= MAX_HEADERS or total > MAX_HEADER_BYTES:
            raise ValueError(
                f"includes more than {MAX_HEADERS} headers or {MAX_HEADER_BYTES} bytes of them"
            )
        found[name] = data.decode("utf-8", errors="replace")
        todo += [inner.decode(errors="replace") for inner in _INCLUDE.findall(data)]
    return tuple(sorted(found.items()))
