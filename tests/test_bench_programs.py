"""The C programs of bench/ (run on a GPU machine only) still build, warning-free, with the
system's compiler: a broken one would only show on the device, where time is scarce."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.parametrize("program", ["ceiling.c", "launch_cost.c"])
def test_a_bench_program_builds_without_warnings(program: str, tmp_path: Path) -> None:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler here")
    flags = ["-O2", "-Wall", "-Wextra", "-Werror", "-pthread"]
    built = subprocess.run(
        [compiler, *flags, "-o", str(tmp_path / "program"), str(BENCH / program), "-ldl"],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    usage = subprocess.run([str(tmp_path / "program")], capture_output=True, text=True)
    assert usage.returncode == 2 and "usage:" in usage.stderr  # no arguments: says how


def test_the_device_scheduler_prototype_builds_where_nvcc_is(tmp_path: Path) -> None:
    """bench/device_sched.cu links CUDA's device runtime (``-rdc``); skipped where there is no
    nvcc."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc here")
    program = tmp_path / "device_sched"
    source = BENCH / "device_sched.cu"
    flags = ["-O2", "-arch=sm_90", "-rdc=true", "-Werror", "all-warnings"]
    built = subprocess.run(
        [nvcc, *flags, "-o", str(program), str(source), "-lcudadevrt"],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    usage = subprocess.run([str(program)], capture_output=True, text=True)
    assert usage.returncode == 2 and "usage:" in usage.stderr


def test_the_device_schedulers_relocatable_code_compiles_with_nvrtc() -> None:
    """bench/device_sched_toolchain.py's first step needs no GPU: NVRTC compiles device code
    that calls the device runtime (``-rdc``), with the CUDA headers the catalog uses."""
    pytest.importorskip("cuda.bindings.nvrtc")
    sys.path.insert(0, str(BENCH))
    try:
        toolchain = importlib.import_module("device_sched_toolchain")
    finally:
        sys.path.remove(str(BENCH))
    image, log = toolchain.compile_relocatable("sm_90")
    assert image[:4] == b"\x7fELF", log  # a relocatable cubin, for the driver's linker
