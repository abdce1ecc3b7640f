"""The test suite's progress output carries no daemon log lines: pytest captures them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_a_daemons_log_lines_stay_out_of_the_progress_output() -> None:
    """An in-process daemon started and stopped by a test logs while pytest is between
    tests (a module's fixture teardown): none of it may reach the terminal."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/launch_service/test_rpcs.py",
            "tests/launch_service/test_ring_stream_calls.py",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    output = result.stdout + result.stderr
    for marker in ("[info", "[debug", "accyd stopped", "client detached"):
        assert marker not in output, output[-2000:]
