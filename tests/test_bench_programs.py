"""The C programs of bench/ (run on a GPU machine only) still build, warning-free, with the
system's compiler: a broken one would only show on the device, where time is scarce."""

from __future__ import annotations

import shutil
import subprocess
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
