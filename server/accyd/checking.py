"""``accyd check``: a catalog validated and its CUDA C++ compiled before any client meets it.

Reads every manifest as ``accyd serve`` does (each error names the file, the entry and the
field), then compiles every ``cuda_cpp`` kernel with NVRTC for each architecture asked
(no GPU needed), each error with NVRTC's log, whose lines name the source file and line.
Triton kernels and cubins are checked as far as a file can be: their metadata and that
they are ELF images; their parameters are checked against the driver when a daemon loads
them on a device.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from accyd.backends.cuda.compile_cache import CompileCache
from accyd.catalog.catalog import load_catalog
from accyd.catalog.entries import ArtifactFormat, KernelEntry
from accyd.errors import AccyError, CatalogError

__all__ = ["Finding", "check_catalog", "main_check", "parse_arch"]

DEFAULT_ARCHS = ((8, 0), (9, 0))


@dataclass(frozen=True, slots=True)
class Finding:
    """One kernel's result for one architecture (``arch`` '' where none applies)."""

    kernel: str
    format: str
    arch: str
    ok: bool
    seconds: float
    message: str = ""


def parse_arch(text: str) -> tuple[int, int]:
    """``sm_90`` (or ``90``, ``9.0``) as a compute capability."""
    found = re.fullmatch(r"(?:sm_|compute_)?(\d)(\d)|(\d+)\.(\d)", text.strip())
    if not found:
        raise ValueError(f"architecture {text!r} is not like sm_90")
    major, minor = (found[1], found[2]) if found[1] else (found[3], found[4])
    return int(major), int(minor)


def check_catalog(
    folders: Sequence[Path], archs: Sequence[tuple[int, int]], builtin: bool = False
) -> list[Finding]:
    """Every kernel's findings; a manifest error raises ``CatalogError`` (nothing else can
    be checked until it is fixed)."""
    catalog = load_catalog(folders, builtin=builtin)
    findings = []
    with tempfile.TemporaryDirectory(prefix="accyd-check-") as scratch:
        cache = CompileCache(scratch)  # a fresh cache: every kernel compiled for real
        for entry in catalog.registry.entries:
            if entry.format is ArtifactFormat.CUDA_CPP:
                findings += [_compile(cache, entry, arch) for arch in archs]
            else:
                findings.append(Finding(entry.target, entry.format.value, "", True, 0.0))
    return findings


def _compile(cache: CompileCache, entry: KernelEntry, arch: tuple[int, int]) -> Finding:
    source = entry.payload.decode() if isinstance(entry.payload, bytes) else entry.payload
    name = f"sm_{arch[0]}{arch[1]}"
    started = time.perf_counter()
    try:
        cache.compile(
            source,
            arch=arch,
            name=entry.source_name,
            options=entry.compile_options,
            headers=entry.headers,
            name_expressions=[] if entry.entry_name.isidentifier() else [entry.entry_name],
        )
    except AccyError as error:
        seconds = time.perf_counter() - started
        return Finding(entry.target, "cuda_cpp", name, False, seconds, error.message)
    return Finding(entry.target, "cuda_cpp", name, True, time.perf_counter() - started)


def main_check(folders: Sequence[Path], archs: Sequence[str], as_json: bool) -> int:
    """Print the findings (a table, or JSON lines); 0 when every kernel passed, 1 when one
    did not, 2 for a manifest error or bad arguments."""
    try:
        wanted = [parse_arch(a) for a in archs] or list(DEFAULT_ARCHS)
        findings = check_catalog(folders, wanted)
    except (CatalogError, ValueError) as error:
        text = error.message if isinstance(error, CatalogError) else str(error)
        if as_json:
            print(json.dumps({"ok": False, "error": text}))
        else:
            print(f"accyd check: {text}", file=sys.stderr)
        return 2
    for finding in findings:
        if as_json:
            print(json.dumps(asdict(finding)))
            continue
        mark = "ok" if finding.ok else "FAILED"
        where = f" {finding.arch}" if finding.arch else ""
        print(f"{mark:6} {finding.kernel} ({finding.format}{where}) {finding.seconds:.2f}s")
        if finding.message:
            print("       " + finding.message.replace("\n", "\n       "))
    failed = sum(1 for f in findings if not f.ok)
    if not as_json:
        print(f"{len(findings) - failed} checks ok, {failed} failed")
    return 1 if failed else 0
