"""The device's partitioned run (``-p tests.partitioned``) still loads and does what it says
where no GPU is: a broken plugin would only show on the device, where time is scarce."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_plugin(*args: str, share: str = "0.5") -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"]
    command += ["-p", "tests.partitioned", *args]
    env = dict(os.environ, ACCY_SUITE_PARTITION_SHARE=share)
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)


def test_the_partitioned_run_skips_the_partition_tests_and_counts_its_backends() -> None:
    done = run_plugin("tests/backends/test_cuda_partitions.py", "tests/core/test_partitions.py")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "partitioned run: 0 CUDA backends opened in a partition" in done.stdout
    assert " passed" in done.stdout  # the host-side partition tests still run


def test_a_share_outside_zero_to_one_is_refused_before_any_test() -> None:
    done = run_plugin("tests/core/test_partitions.py", share="1.5")
    assert done.returncode != 0
    assert "ACCY_SUITE_PARTITION_SHARE=1.5: give a share in (0, 1)" in done.stdout + done.stderr
