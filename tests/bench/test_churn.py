"""The churn benchmark (bench/churn.py), CI-sized: 20 s of four kinds of client lives, some
SIGKILLed, on the host backend; no wrong result, memory flat, the daemon clean after."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def churn() -> Iterator[ModuleType]:
    sys.path.insert(0, str(BENCH))
    try:
        import churn

        yield churn
    finally:
        sys.path.remove(str(BENCH))


@pytest.mark.alone
@pytest.mark.slow
def test_twenty_seconds_of_churn_leave_the_daemon_as_it_was(tmp_path: Path) -> None:
    out = tmp_path / "churn.json"
    command = [sys.executable, str(BENCH / "churn.py"), "--minutes", str(20 / 60)]
    command += ["--workers", "4", "--sample", "1", "--kill-share", "0.3", "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=BENCH)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(out.read_text())["summary"]
    assert summary["failures"] == []
    assert set(summary["lives_by_kind"]) == {"ring", "ring_stream", "kserve", "kserve_stream"}
    assert summary["kills"] >= 1 and summary["verified"] > 100
    assert summary["wrong"] == 0 and summary["errors"] == 0 and summary["stray_lines"] == 0
    assert summary["after"]["fds"] <= summary["baseline"]["fds"] + 2
    assert done.stdout.rstrip().endswith("| goals | all met |")


def test_a_traceback_outside_the_log_and_growing_memory_fail_the_run(churn: ModuleType) -> None:
    log = '{"event": "serving", "level": "info"}\nTraceback (most recent call last):\n\n[1, 2]\n'
    assert churn.stray_lines(log) == ["Traceback (most recent call last):", "[1, 2]"]
    report = churn.Report(60, 4, "host", "host", churn.Goals(0.10, 20.0, 2))
    report.baseline = report.after = {"fds": 20, "clients": 1, "sessions": 0, "buffers": 0}
    report.exit_code = 0
    flat = [churn.Sample(t, 100 << 20, 20, 20, 1, 0, 0, 4) for t in range(0, 60, 5)]
    report.samples = flat
    assert report.failures() == []
    report.samples = [churn.Sample(s.t, (100 + 2 * s.t) << 20, 20, 20, 1, 0, 0, 4) for s in flat]
    (growth,) = report.failures()
    assert "RSS grew 40.0 MiB from the middle third to the last" in growth
    report.samples, report.after = flat, {**report.baseline, "fds": 23}
    assert report.failures() == ["3 descriptors more than the baseline at the end"]
