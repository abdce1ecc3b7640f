"""The contention benchmark (bench/contention.py) on the host backend: every series runs and
the table comes last, the partition the host cannot make named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_every_series_runs_on_the_host_backend(tmp_path: Path) -> None:
    out = tmp_path / "contention.json"
    command = [sys.executable, str(BENCH / "contention.py"), "--backend", "host"]
    command += ["--clients", "2", "--seconds", "0.2", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=BENCH)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    for name in ("crowd_2_budget", "crowd_2_no_budget"):
        found = report["crowd"][name]
        assert "error" not in found, found
        assert len(found["per_process"]) == 2 and found["p99_us"] > 0
    noisy = report["noisy"]
    assert noisy["unconfined"]["alone"]["count"] > 0
    for variant in ("unconfined", "confined"):
        assert noisy[variant]["aggressor"]["per_second"] > 0, noisy[variant]
        assert noisy[variant]["victim"]["count"] > 0
    (line,) = noisy["confined"]["partition_log"]
    assert "SM partitions not made on device 0: the host backend" in line
    table = done.stdout[done.stdout.rindex("| series |") :]
    assert "victim, aggressor confined" in table and "goal <= 1.2" in table


def test_the_aggressors_rates_compare_work_not_kernels() -> None:
    """Each variant calibrates the aggressor's kernel to the same length: confined to fewer
    SMs, a kernel does less, so equal kernels/s is less work (on the H200, 523 confined and
    513 unconfined kernels/s read as 1.02x whether or not the partition held)."""
    sys.path.insert(0, str(BENCH))
    try:
        from contention import table
    finally:
        sys.path.remove(str(BENCH))
    victim = {"p50_us": 30.0, "p99_us": 40.0}
    report = {
        "noisy": {
            "unconfined": {
                "alone": victim,
                "victim": victim,
                "aggressor": {"per_second": 500.0, "iters": 50_000},
            },
            "confined": {
                "victim": victim,
                "aggressor": {"per_second": 500.0, "iters": 42_500},
                "partition_log": [],
            },
        }
    }
    shown = table(report)
    assert "aggressor 500 x 42,500 iters" in shown
    assert "(kernels/s x iters) / unconfined: 0.85 (goal >= 0.8)" in shown, shown
    assert "MPS" not in shown  # no series under MPS on the host backend

    hurt = {"p50_us": 30.0, "p99_us": 60.0}
    report["noisy_mps"] = {
        "alone": victim,
        "unlimited": {
            "victim": hurt,
            "aggressor": {"per_second": 500.0, "iters": 50_000},
            "percentage": None,
        },
        "limited": {
            "victim": victim,
            "aggressor": {"per_second": 500.0, "iters": 26_000},
            "percentage": 50,
        },
    }
    shown = table(report)
    assert "| MPS: victim, aggressor at 50% threads | aggressor 500 x 26,000 iters |" in shown
    assert "victim p99 / alone 1.00; aggressor's work / unlimited 0.52" in shown, shown
