"""The sharing benchmark (bench/bench_sharing.py): its accy series on the host backend, its MPS
control (against a stand-in program) and its goal ratios."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))  # the benchmark's modules import one another by bare name

from _sharing_cuda import MpsUnavailable, mps_server  # noqa: E402
from _sharing_report import GOALS, lookup, ratios  # noqa: E402

ACCY_SERIES: dict[str, list[tuple[str, ...]]] = {
    "round_trip": [("launch", "p50_us"), ("launch", "p99_us")],
    "one_client": [("per_second",)],
    "clients_short": [("per_second",)],
    "clients_long": [("per_second",)],
    "clients_short_waited": [("per_second",)],
    "clients_long_waited": [("per_second",)],
    "remote_rate": [("per_second",)],
    "remote_round_trip": [("launch", "p50_us"), ("stream_echo", "p50_us"), ("request_bytes",)],
    "scan": [("p50_us",), ("p99_us",)],
}


@pytest.fixture(scope="module")
def host_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("sharing") / "sharing.json"
    command = [sys.executable, str(BENCH / "bench_sharing.py"), "--backend", "host"]
    command += ["--out", str(out), "--clients", "2", "--seconds", "0.3", "--iterations", "40"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text()), done.stdout


def test_every_accy_series_ran_with_positive_numbers(host_run: tuple[dict[str, Any], str]) -> None:
    report, _ = host_run
    assert report["backend"] == "host" and report["clients"] == 2
    for series, paths in ACCY_SERIES.items():
        found = report["accy"][series]
        assert "error" not in found, f"{series}: {found.get('error')}\n{found.get('trace')}"
        for path in paths:
            assert lookup(found, path) is not None, (series, path, found)
    assert report["accy"]["clients_short"]["processes"] == 2
    assert len(report["accy"]["clients_long"]["per_process"]) == 2
    assert report["accy"]["round_trip"]["launch"]["count"] == 40


def test_the_host_run_has_the_remote_ratios_and_prints_the_goals_table_last(
    host_run: tuple[dict[str, Any], str],
) -> None:
    report, output = host_run
    by_goal = {row["goal"]: row for row in report["ratios"]}
    assert len(by_goal) == len(GOALS)
    remote = [row for goal, row in by_goal.items() if goal.startswith("remote")]
    assert len(remote) == 2 and all(row["value"] > 0 for row in remote), remote
    in_process = [row for row in report["ratios"] if row["baseline"] is None and row["accy"]]
    assert in_process, "rows without a baseline still show accy's number"
    lines = output.strip().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| goal |"))
    assert len(lines) - header == 2 + len(GOALS), "the goals table is not what prints last"
    assert lines[-1].startswith("| device_scan")


def test_ratios_compare_against_each_baseline_and_say_whether_the_goal_is_met() -> None:
    report = {
        "baselines": {
            "in_process": {
                "round_trip": {"p50_us": 10.0},
                "one_stream": {"short": {"per_second": 100.0}},
            },
            "mps_long": {"per_second": 1000.0},
            "mps_long_waited": {"per_second": 100.0},
            "mps_short_waited": {"per_second": 400.0},
            "mps_short": {"error": "MPS did not start"},
        },
        "accy": {
            "round_trip": {"launch": {"p50_us": 15.0}},
            "one_client": {"per_second": 80.0},
            "clients_long": {"per_second": 950.0},
            "clients_short": {"per_second": 120.0},
            "clients_long_waited": {"per_second": 95.0},
            "clients_short_waited": {"per_second": 200.0},
            "remote_rate": {"per_second": 80_000.0},
            "remote_round_trip": {"launch": {"p50_us": 320.0}, "stream_echo": {"p50_us": 200.0}},
            "scan": {"p50_us": 11.0},
        },
    }
    values = [(round(r["value"], 3) if r["value"] else None, r["met"]) for r in ratios(report)]
    assert values == [
        (1.5, True),  # round trip 15 / 10
        (0.8, False),  # one client 80 / 100
        (0.95, True),  # 8 clients waited, long: 95 / 100
        (0.5, False),  # 8 clients waited, short: 200 / 400
        (0.95, True),  # 8 clients every 16, long: 950 / 1000
        (None, None),  # MPS short failed: no ratio, not judged
        (0.95, False),  # moonshot long
        (None, None),  # moonshot short
        (80_000.0, True),  # remote launches/s, absolute
        (1.6, False),  # remote round trip 320 / 200
        (1.1, True),  # scan 11 / 10
    ]


def _stand_in_control(folder: Path, exit_on_start: bool = False) -> Path:
    """A program named nvidia-cuda-mps-control: -f makes the control pipe and waits for quit."""
    program = folder / "nvidia-cuda-mps-control"
    program.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-f" ]; then\n'
        + ("  echo 'cannot start: no device' >&2; exit 7\n" if exit_on_start else "")
        + '  : > "$CUDA_MPS_PIPE_DIRECTORY/control"\n'
        '  while [ -e "$CUDA_MPS_PIPE_DIRECTORY/control" ]; do sleep 0.05; done\n'
        '  sleep 0.2; echo exited >> "$STAND_IN_LOG"\n'
        "  exit 0\n"
        "fi\n"
        'read line; [ "$line" = quit ] && rm "$CUDA_MPS_PIPE_DIRECTORY/control"\n'
    )
    program.chmod(program.stat().st_mode | stat.S_IEXEC)
    return program


def test_mps_is_quit_and_waited_for_even_when_the_series_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _stand_in_control(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STAND_IN_LOG", str(tmp_path / "exits"))
    seen: dict[str, str] = {}
    with pytest.raises(RuntimeError, match="a series failed"), mps_server(timeout=10) as env:
        seen.update(env)
        assert Path(env["CUDA_MPS_PIPE_DIRECTORY"], "control").exists()
        raise RuntimeError("a series failed")
    assert (tmp_path / "exits").read_text() == "exited\n", "left before the daemon exited"
    pipe = Path(seen["CUDA_MPS_PIPE_DIRECTORY"])
    assert not pipe.exists(), "the private folders are removed after quit"


def test_mps_that_cannot_start_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _stand_in_control(tmp_path, exit_on_start=True)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with (
        pytest.raises(MpsUnavailable, match="exited with 7: cannot start: no device"),
        mps_server(timeout=10),
    ):
        pass
