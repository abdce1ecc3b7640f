"""CUDA C++ compiled with NVRTC from the CUDA wheels, no GPU needed: CUDA's own headers,
headers beside the manifest, templates by name expression, ``accyd check``, and a compile
cache that trusts no folder another user could write to."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from accyd.backends.cuda.compile_cache import CompileCache, KernelCompileError, KernelImage
from accyd.errors import FailedPrecondition

USER = Path(__file__).parents[1] / "catalogs" / "user_kernels"


def _nvrtc() -> bool:
    try:
        CompileCache().nvrtc_version  # noqa: B018 - loads libnvrtc, or raises
    except Exception:
        return False
    return True


pytestmark = pytest.mark.skipif(not _nvrtc(), reason="NVRTC is not installed here")

HALF = """
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cooperative_groups.h>
#include <cub/block/block_reduce.cuh>
#include "mine.cuh"
template <typename T> __global__ void twice(T* x) { x[threadIdx.x] = x[threadIdx.x] * T(TWO); }
extern "C" __global__ void h(__half* x, __nv_bfloat16* y) { x[0] = __hadd(x[0], x[0]); }
"""


def _half(cache: CompileCache) -> KernelImage:
    return cache.compile(
        HALF,
        arch=(9, 0),
        name="half.cu",
        headers=[("mine.cuh", "#define TWO 2.0f\n")],
        name_expressions=["twice<float>"],
        options=["--use_fast_math"],
    )


def test_cuda_headers_local_headers_and_name_expressions(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path / "cache")
    image = _half(cache)
    assert image.kind in ("cubin", "ptx") and image.data
    assert image.symbol("twice<float>") == "_Z5twiceIfEvPT_"
    again = _half(cache)
    assert again.from_cache and again.lowered == image.lowered  # the lowered name is kept
    other = cache.key(HALF, (9, 0), ["--use_fast_math"], [("mine.cuh", "#define TWO 3.0f\n")])
    assert other != image.key  # a header's text is part of the key


def test_a_compile_error_names_the_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(KernelCompileError) as caught:
        CompileCache(tmp_path).compile(
            "__global__ void k() {\n  int x = ;\n}", arch=(9, 0), name="bad.cu"
        )
    assert isinstance(caught.value, FailedPrecondition)  # the catalog's to fix: not retryable
    assert "bad.cu(2): error" in caught.value.message


def test_an_unsafe_cache_folder_is_not_used(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    folder.mkdir()
    cache = CompileCache(folder)
    first = cache.compile("__global__ void k() {}", arch=(9, 0))
    planted = folder / f"{first.key}.bin"
    assert planted.exists()
    folder.chmod(0o777)  # now anyone may plant an entry: the cache must not trust it
    again = cache.compile("__global__ void k() {}", arch=(9, 0))
    assert not again.from_cache
    assert "others may write to it (mode 0777)" in cache.stats.unsafe
    folder.chmod(0o700)
    assert cache.compile("__global__ void k() {}", arch=(9, 0)).from_cache


def _check(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "accyd.cli", "check", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_accyd_check_compiles_a_good_catalog() -> None:
    done = _check("--catalog", str(USER), "--arch", "sm_90", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    findings = [json.loads(line) for line in done.stdout.splitlines()]
    assert {f["kernel"] for f in findings} >= {"user.axpy_f16", "user.scale_f32", "user.wmma_gemm"}
    assert all(f["ok"] and f["arch"] == "sm_90" for f in findings)


def test_accyd_check_names_a_broken_kernel(tmp_path: Path) -> None:
    shutil.copytree(USER, tmp_path / "user")
    source = tmp_path / "user" / "kernels.cu"
    source.write_text(
        source.read_text().replace("if (i < n) out[i] = __hfma", "if (i < n) out[i] = oops")
    )
    done = _check("--catalog", str(tmp_path / "user"), "--arch", "sm_90")
    assert done.returncode == 1
    assert "FAILED user.axpy_f16 (cuda_cpp sm_90)" in done.stdout
    assert "kernels.cu(" in done.stdout and "oops" in done.stdout


def test_accyd_check_refuses_a_broken_manifest(tmp_path: Path) -> None:
    (tmp_path / "m.toml").write_text('[[kernel]]\ntarget = "x"\n')
    done = _check("--catalog", str(tmp_path))
    assert done.returncode == 2
    assert "field 'version': is required" in done.stderr
    assert os.path.basename(tmp_path / "m.toml") in done.stderr


def test_the_device_launchers_source_compiles_relocatable_with_the_hosts_layout(
    tmp_path: Path,
) -> None:
    """The device launcher (``backends/cuda/device_launcher.py``) is built by the daemon
    itself: NVRTC compiles its source as relocatable code (it launches graphs from the
    device), with no GPU. The source asserts the sizes and offsets of the tables the host
    packs, so a layout that drifted fails here, in CI, not on a device; and the driver's
    linker needs ``libcudadevrt.a``, which the CUDA runtime's wheel must provide."""
    from accyd.backends.cuda import launcher_source
    from accyd.backends.cuda.devrt import find_devrt

    image = CompileCache(tmp_path).compile(
        launcher_source.source(), arch=(9, 0), name="accy_launcher.cu", options=["-rdc=true"]
    )
    assert image.kind == "cubin" and len(image.data) > 1000
    drifted = launcher_source.source().replace(
        f"sizeof(Ring) == {launcher_source.RING_BYTES}",
        f"sizeof(Ring) == {launcher_source.RING_BYTES + 8}",
    )
    with pytest.raises(KernelCompileError, match="Ring's size is the host's"):
        CompileCache(tmp_path).compile(
            drifted, arch=(9, 0), name="accy_launcher.cu", options=["-rdc=true"]
        )
    assert Path(find_devrt()).name == "libcudadevrt.a"
