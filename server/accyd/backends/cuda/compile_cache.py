"""NVRTC compilation of CUDA C++ for one device architecture, cached on disk by content hash."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from accyd.backends.cuda.driver import check_nvrtc, nvrtc_module, program_log
from accyd.errors import RuntimeUnavailable

__all__ = ["CacheStats", "CompileCache", "KernelImage", "default_cache_dir"]

DEFAULT_OPTIONS: tuple[str, ...] = ("--std=c++17", "-lineinfo")
"""Options every compile gets (before the caller's); part of the cache key."""

_MAGIC = b"ACCYKC1\n"
_KINDS: dict[bytes, Literal["cubin", "ptx"]] = {b"C": "cubin", b"P": "ptx"}
_DIGEST = 32


def default_cache_dir() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/accy/kernels``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "accy" / "kernels"


@dataclass(frozen=True, slots=True)
class KernelImage:
    """A compiled module image: a cubin for the exact architecture, or PTX when NVRTC
    is older than the device (the driver then JIT-compiles it at load)."""

    kind: Literal["cubin", "ptx"]
    data: bytes
    key: str
    from_cache: bool
    log: str = ""


@dataclass(slots=True)
class CacheStats:
    hits: int = 0
    misses: int = 0
    corrupt: int = 0
    compile_seconds: float = 0.0
    write_errors: int = 0


@dataclass(slots=True)
class _Toolchain:
    version: tuple[int, int]
    supported_archs: tuple[int, ...] = field(default_factory=tuple)


class CompileCache:
    """Compiles CUDA C++ with NVRTC and keeps each image in ``cache_dir`` as ``<sha256>.bin``.

    The key is the sha256 of the source, the options, the target architecture and the
    NVRTC version. Entries are written to a temporary file and renamed into place, so
    readers never see half an entry; each entry carries the sha256 of its image, and one
    that does not match (or that fails to load: ``invalidate``) is deleted and compiled
    again. Safe to share between threads; the counters are in ``stats``.
    """

    def __init__(self, cache_dir: str | os.PathLike[str] | None = None) -> None:
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.stats = CacheStats()
        self._lock = threading.Lock()
        self._toolchain: _Toolchain | None = None

    # -- NVRTC ---------------------------------------------------------------

    def _tools(self) -> _Toolchain:
        if self._toolchain is None:
            rtc = nvrtc_module()
            try:
                major, minor = check_nvrtc(rtc.nvrtcVersion(), "nvrtcVersion")
                archs = check_nvrtc(rtc.nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs")
            except RuntimeUnavailable:
                raise
            except Exception as error:  # the library itself could not be found or loaded
                raise RuntimeUnavailable(f"NVRTC is not available: {error}") from None
            self._toolchain = _Toolchain((int(major), int(minor)), tuple(int(a) for a in archs))
        return self._toolchain

    @property
    def nvrtc_version(self) -> tuple[int, int]:
        return self._tools().version

    def target_for(self, arch: tuple[int, int]) -> tuple[Literal["cubin", "ptx"], str]:
        """The image kind and ``--gpu-architecture`` value for a compute capability."""
        wanted = arch[0] * 10 + arch[1]
        supported = self._tools().supported_archs
        if wanted in supported:
            return "cubin", f"sm_{wanted}"
        older = [a for a in supported if a <= wanted]
        if not older:
            raise RuntimeUnavailable(
                f"NVRTC {self.nvrtc_version} supports none of the architectures up to sm_{wanted}"
            )
        return "ptx", f"compute_{max(older)}"

    def key(self, source: str, arch: tuple[int, int], options: Sequence[str] = ()) -> str:
        """The cache key of one compile."""
        kind, target = self.target_for(arch)
        major, minor = self.nvrtc_version
        digest = hashlib.sha256()
        for part in (
            b"accy-kernel-cache-v1",
            f"nvrtc {major}.{minor}".encode(),
            f"{kind} {target}".encode(),
            "\0".join((*DEFAULT_OPTIONS, *options)).encode(),
            source.encode(),
        ):
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)
        return digest.hexdigest()

    # -- the cache -----------------------------------------------------------

    def compile(
        self,
        source: str,
        *,
        arch: tuple[int, int],
        name: str = "kernel.cu",
        options: Sequence[str] = (),
        use_cache: bool = True,
    ) -> KernelImage:
        """The image of ``source`` for ``arch``: from the cache, or compiled and stored."""
        key = self.key(source, arch, options)
        if use_cache:
            cached = self._read(key)
            if cached is not None:
                with self._lock:
                    self.stats.hits += 1
                return cached
        kind, target = self.target_for(arch)
        started = time.perf_counter()
        data, log = self._nvrtc(source, name, kind, [f"--gpu-architecture={target}", *options])
        elapsed = time.perf_counter() - started
        with self._lock:
            self.stats.misses += 1
            self.stats.compile_seconds += elapsed
        self._write(key, kind, data)
        return KernelImage(kind, data, key, from_cache=False, log=log)

    def invalidate(self, key: str) -> None:
        """Delete one entry (for example one whose image the driver refused)."""
        with self._lock:
            self.stats.corrupt += 1
        with contextlib.suppress(OSError):
            self._path(key).unlink()

    def _path(self, key: str) -> Path:
        return self.cache_dir / f"{key}.bin"

    def _read(self, key: str) -> KernelImage | None:
        path = self._path(key)
        try:
            blob = path.read_bytes()
        except OSError:
            return None
        header = len(_MAGIC) + 1 + _DIGEST
        kind = _KINDS.get(blob[len(_MAGIC) : len(_MAGIC) + 1])
        data = blob[header:]
        if (
            len(blob) <= header
            or not blob.startswith(_MAGIC)
            or kind is None
            or hashlib.sha256(data).digest() != blob[len(_MAGIC) + 1 : header]
        ):
            self.invalidate(key)
            return None
        return KernelImage(kind, data, key, from_cache=True)

    def _write(self, key: str, kind: Literal["cubin", "ptx"], data: bytes) -> None:
        tag = b"C" if kind == "cubin" else b"P"
        blob = _MAGIC + tag + hashlib.sha256(data).digest() + data
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=self.cache_dir)
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(blob)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, self._path(key))
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError:
            # An unwritable cache costs a compile next time, nothing more.
            with self._lock:
                self.stats.write_errors += 1

    # -- NVRTC proper ----------------------------------------------------------

    def _nvrtc(
        self, source: str, name: str, kind: Literal["cubin", "ptx"], options: Sequence[str]
    ) -> tuple[bytes, str]:
        rtc = nvrtc_module()
        program: Any = check_nvrtc(
            rtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []), "nvrtcCreateProgram"
        )
        try:
            opts = [o.encode() for o in (*DEFAULT_OPTIONS, *options)]
            check_nvrtc(
                rtc.nvrtcCompileProgram(program, len(opts), opts),
                f"NVRTC compile of {name}",
                program,
            )
            if kind == "cubin":
                size = int(check_nvrtc(rtc.nvrtcGetCUBINSize(program), "nvrtcGetCUBINSize"))
                data = b" " * size
                check_nvrtc(rtc.nvrtcGetCUBIN(program, data), "nvrtcGetCUBIN")
            else:
                size = int(check_nvrtc(rtc.nvrtcGetPTXSize(program), "nvrtcGetPTXSize"))
                data = b" " * size
                check_nvrtc(rtc.nvrtcGetPTX(program, data), "nvrtcGetPTX")
                data = data.rstrip(b"\0")
            return data, program_log(program)
        finally:
            rtc.nvrtcDestroyProgram(program)
