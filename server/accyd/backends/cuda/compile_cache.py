"""NVRTC compilation of CUDA C++ for one device architecture, cached on disk by content hash.

CUDA's own headers (``cuda_fp16.h``, ``cuda_bf16.h``, ``cuda_fp8.h``, cooperative groups,
CCCL's CUB and libcu++) are found with ``cuda.pathfinder`` in the installed CUDA wheels or
toolkit, with no setup; a kernel's headers from beside its manifest come in memory.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from accy.protocol.sockets import unsafe_folder_reason
from accyd.backends.cuda.driver import check_nvrtc, nvrtc_module, program_log
from accyd.errors import FailedPrecondition, RuntimeUnavailable

__all__ = [
    "CacheStats",
    "CompileCache",
    "KernelCompileError",
    "KernelImage",
    "cuda_include_dirs",
    "default_cache_dir",
]

DEFAULT_OPTIONS: tuple[str, ...] = ("--std=c++17", "-lineinfo")
"""Options every compile gets (before the caller's); part of the cache key."""

_MAGIC = b"ACCYKC2\n"
_KINDS: dict[bytes, Literal["cubin", "ptx"]] = {b"C": "cubin", b"P": "ptx"}
_DIGEST = 32


class KernelCompileError(FailedPrecondition):
    """CUDA C++ that NVRTC refused: the catalog's to fix, so not retryable; the message
    holds NVRTC's log, whose lines name the source file and line."""


@functools.cache
def cuda_include_dirs() -> tuple[str, ...]:
    """The folders of CUDA's own headers: the runtime's, CCCL's and the compiler's (``crt/``,
    which ``mma.h`` needs), from the CUDA wheels, then ``CUDA_HOME``/``CUDA_PATH`` or a
    toolkit (empty where none is installed)."""
    try:
        pathfinder: Any = importlib.import_module("cuda.pathfinder")
    except ImportError:
        return ()
    found: list[str] = []
    for library in ("cudart", "cccl", "nvcc"):
        try:
            folder = pathfinder.find_nvidia_header_directory(library)
        except Exception:  # a probe that fails finds nothing
            folder = None
        if folder and folder not in found:
            found.append(folder)
    with contextlib.suppress(Exception):
        home = pathfinder.get_cuda_path_or_home()
        toolkit = os.path.join(home, "include") if home else None
        if toolkit and os.path.isdir(toolkit) and toolkit not in found:
            found.append(toolkit)
    return tuple(found)


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
    lowered: tuple[tuple[str, str], ...] = ()
    """(name expression, mangled name) of each template asked for by name."""

    def symbol(self, entry: str) -> str:
        """The module's symbol for a kernel named ``entry`` (lowered where it is a name
        expression such as ``scale<float>``)."""
        return dict(self.lowered).get(entry, entry)


@dataclass(slots=True)
class CacheStats:
    hits: int = 0
    misses: int = 0
    corrupt: int = 0
    compile_seconds: float = 0.0
    write_errors: int = 0
    unsafe: str = ""
    """Why the cache folder is not used ('' while it is): another user owns it, or others
    may write to it, so an entry there could be a kernel nobody compiled."""


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

    def key(
        self,
        source: str,
        arch: tuple[int, int],
        options: Sequence[str] = (),
        headers: Sequence[tuple[str, str]] = (),
        name_expressions: Sequence[str] = (),
    ) -> str:
        """The cache key of one compile: every input NVRTC sees, and its version."""
        kind, target = self.target_for(arch)
        major, minor = self.nvrtc_version
        digest = hashlib.sha256()
        for part in (
            b"accy-kernel-cache-v2",
            f"nvrtc {major}.{minor}".encode(),
            f"{kind} {target}".encode(),
            "\0".join(self._options(options)).encode(),
            json.dumps([list(h) for h in headers]).encode(),
            "\0".join(name_expressions).encode(),
            source.encode(),
        ):
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)
        return digest.hexdigest()

    @staticmethod
    def _options(options: Sequence[str]) -> list[str]:
        return [*DEFAULT_OPTIONS, *(f"-I{d}" for d in cuda_include_dirs()), *options]

    # -- the cache -----------------------------------------------------------

    def compile(
        self,
        source: str,
        *,
        arch: tuple[int, int],
        name: str = "kernel.cu",
        options: Sequence[str] = (),
        headers: Sequence[tuple[str, str]] = (),
        name_expressions: Sequence[str] = (),
        use_cache: bool = True,
    ) -> KernelImage:
        """The image of ``source`` for ``arch``: from the cache, or compiled and stored.

        ``headers`` are (include name, text) given to NVRTC in memory; each of
        ``name_expressions`` (``"scale<float>"``) is instantiated and its mangled name
        kept with the image. A compile error is ``KernelCompileError`` with NVRTC's log.
        """
        key = self.key(source, arch, options, headers, name_expressions)
        if use_cache and self._usable():
            cached = self._read(key)
            if cached is not None:
                with self._lock:
                    self.stats.hits += 1
                return cached
        kind, target = self.target_for(arch)
        started = time.perf_counter()
        data, log, lowered = self._nvrtc(
            source,
            name,
            kind,
            [f"--gpu-architecture={target}", *self._options(options)],
            headers,
            name_expressions,
        )
        elapsed = time.perf_counter() - started
        with self._lock:
            self.stats.misses += 1
            self.stats.compile_seconds += elapsed
        if self._usable():
            self._write(key, kind, data, lowered)
        return KernelImage(kind, data, key, from_cache=False, log=log, lowered=lowered)

    def _usable(self) -> bool:
        """Whether the cache folder may be read and written: missing (made 0700 on first
        write), or a real folder of this user that nobody else may write to."""
        reason = unsafe_folder_reason(self.cache_dir)
        if reason:
            with self._lock:
                self.stats.unsafe = f"{self.cache_dir}: {reason}"
        return not reason

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
        header = len(_MAGIC) + 1 + _DIGEST + 4
        kind = _KINDS.get(blob[len(_MAGIC) : len(_MAGIC) + 1])
        body = blob[header:]
        names_size = int.from_bytes(blob[header - 4 : header], "little")
        try:
            if (
                len(blob) <= header + names_size
                or not blob.startswith(_MAGIC)
                or kind is None
                or hashlib.sha256(body).digest() != blob[len(_MAGIC) + 1 : header - 4]
            ):
                raise ValueError("corrupt")
            lowered = tuple((str(a), str(b)) for a, b in json.loads(body[:names_size]))
        except (ValueError, TypeError):
            self.invalidate(key)
            return None
        return KernelImage(kind, body[names_size:], key, from_cache=True, lowered=lowered)

    def _write(
        self,
        key: str,
        kind: Literal["cubin", "ptx"],
        data: bytes,
        lowered: Sequence[tuple[str, str]] = (),
    ) -> None:
        tag = b"C" if kind == "cubin" else b"P"
        names = json.dumps([list(pair) for pair in lowered]).encode()
        body = names + data
        blob = _MAGIC + tag + hashlib.sha256(body).digest() + len(names).to_bytes(4, "little")
        blob += body
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
        self,
        source: str,
        name: str,
        kind: Literal["cubin", "ptx"],
        options: Sequence[str],
        headers: Sequence[tuple[str, str]],
        name_expressions: Sequence[str],
    ) -> tuple[bytes, str, tuple[tuple[str, str], ...]]:
        rtc = nvrtc_module()
        program: Any = check_nvrtc(
            rtc.nvrtcCreateProgram(
                source.encode(),
                name.encode(),
                len(headers),
                [text.encode() for _, text in headers],
                [include.encode() for include, _ in headers],
            ),
            "nvrtcCreateProgram",
        )
        try:
            for expression in name_expressions:
                check_nvrtc(
                    rtc.nvrtcAddNameExpression(program, expression.encode()),
                    f"nvrtcAddNameExpression({expression!r})",
                )
            opts = [o.encode() for o in options]
            (err,) = rtc.nvrtcCompileProgram(program, len(opts), opts)
            if err == rtc.nvrtcResult.NVRTC_ERROR_COMPILATION:
                raise KernelCompileError(
                    f"{name} does not compile (NVRTC):\n{program_log(program)}", field="source"
                )
            check_nvrtc((err,), f"NVRTC compile of {name}", program)
            lowered = tuple(
                (
                    expression,
                    _text(
                        check_nvrtc(
                            rtc.nvrtcGetLoweredName(program, expression.encode()),
                            f"nvrtcGetLoweredName({expression!r})",
                        )
                    ),
                )
                for expression in name_expressions
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
            return data, program_log(program), lowered
        finally:
            rtc.nvrtcDestroyProgram(program)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
