"""The two-device benchmark (bench/two_devices.py): its arguments, its checks and counts, its
table, and a whole small run on the host backend."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))  # the benchmark's modules import one another by bare name

from _two_devices_clients import CheckFailed, check_last, is_lost, kind_of  # noqa: E402
from _two_devices_fault import split_times  # noqa: E402
from two_devices import isolated, listed_devices, parse_args, table  # noqa: E402

from accy import errors  # noqa: E402


def test_defaults_follow_the_backend_and_clients_must_split_evenly() -> None:
    cuda = parse_args(["--backend", "cuda"])
    assert (cuda.n, cuda.clients, cuda.seconds, cuda.json) == (1 << 26, 16, 5.0, None)
    host = parse_args(["--backend", "host", "--n", "100", "--json"])
    assert (host.n, host.seconds, host.json) == (100, 1.0, "-")
    for wrong in (["--clients", "3"], ["--clients", "0"], ["--seconds", "0"], ["--n", "0"]):
        with pytest.raises(SystemExit):
            parse_args(wrong)


def test_the_last_element_check_tells_ones_from_twos_and_from_nothing() -> None:
    n = 1 << 26
    check_last(float(n), n, 1)
    check_last(float(2 * n), n, 2)
    check_last(float(n + 8), n + 7, 1)  # 2^26 + 7 rounds to a multiple of 8 in float32
    for got, factor in ((float(n), 2), (0.0, 1), (float(n - 64), 1)):
        with pytest.raises(CheckFailed):
            check_last(got, n, factor)


def test_lost_errors_are_told_from_others() -> None:
    lost = errors.BufferLost("buf_1", "the device faulted", session="ses_1")
    dropped = errors.Unavailable("gone", reason="DEVICE_LOST", metadata={"session": "ses_1"})
    other = errors.InvalidArgument("no", reason="BAD")
    assert is_lost(lost) and is_lost(dropped) and not is_lost(other)
    assert not is_lost(CheckFailed("wrong"))
    assert (kind_of(lost), kind_of(dropped)) == (
        "BufferLost BUFFER_LOST",
        "Unavailable DEVICE_LOST",
    )


def test_checked_results_split_at_the_fault_and_at_the_return() -> None:
    assert split_times([0.5, 1.0, 1.5, 2.0, 2.5, 3.0], [1.0, 2.5]) == [1, 3, 2]
    assert split_times([], [1.0, 2.0]) == [0, 0, 0]


def test_status_devices_are_read_from_entries_or_missing() -> None:
    assert listed_devices({"serving": True}) is None
    assert listed_devices({"devices": []}) is None
    assert listed_devices({"devices": [{"device": 1, "sessions": 2}, {"device": 0}]}) == [0, 1]
    assert listed_devices({"devices": [{"ordinal": 0}, {"index": 1}]}) == [0, 1]
    assert listed_devices({"devices": [1, 0]}) == [0, 1]


def _fault(**changes: Any) -> dict[str, Any]:
    """Phase C's findings where everything went as the issue asks."""
    found: dict[str, Any] = {
        "loopers": 8,
        "device0_checked": {"before": 900, "until_device1_back": 200, "after": 800},
        "device0_rates": {"before": 900.0, "until_device1_back": 950.0, "after": 910.0},
        "device0_errors": 0,
        "device0_error_kinds": {},
        "device0_reattachments": 0,
        "fault_code": "UNAVAILABLE",
        "fault_reason": "DEVICE_LOST",
        "fault_session_named": True,
        "probe_good_s": 0.12,
        "probe_tries": 3,
        "probe_errors": ["a", "b"],
        "both_device0": "ok",
        "both_device1_buffer": "BufferLost DATA_LOSS BUFFER_LOST: ...",
        "both_device1_buffer_lost": True,
        "reattachments": {"fault": 0, "probe": 0, "both": 0},
        "instance_changed": False,
        "devices_listed": [0, 1],
    }
    return found | changes


def _report(**c_changes: Any) -> dict[str, Any]:
    return {
        "clients": 16,
        "a": {"per_second": 1000.0, "errors": 0},
        "b": {"per_second": 1950.0, "errors": 0},
        "c": _fault(**c_changes),
    }


def _met(text: str) -> dict[str, str]:
    """The table's ``met`` column by measure (rows without a goal left out)."""
    cells = [line.split(" | ") for line in text.splitlines()[2:]]
    return {row[0].lstrip("| "): row[3].rstrip(" |") for row in cells if row[3].strip(" |")}


def test_the_table_holds_every_goal_and_says_which_are_met() -> None:
    good = _report()
    met = _met(table(good))
    assert len(met) == 8 and set(met.values()) == {"yes"}, met
    assert "| B / A | 1.95x | >= 1.9x | yes |" in table(good)
    assert isolated(good["c"])

    bad = _report(
        device0_errors=3,
        device0_error_kinds={"BufferLost BUFFER_LOST": 3},
        probe_good_s=None,
        instance_changed=True,
        devices_listed=None,
    )
    bad["b"]["per_second"] = 1500.0
    met = _met(table(bad))
    missed = {k for k, v in met.items() if v == "NO"}
    assert missed == {
        "B / A",
        "C: device 0 errors",
        "C: fault answer -> first checked result on device 1 (probe)",
        "C: after: same daemon instance, devices in status",
    }, met
    assert "3 (BufferLost BUFFER_LOST: 3)" in table(bad) and "| never |" in table(bad)
    assert not isolated(bad["c"])


def test_a_failed_phase_is_a_row_saying_so() -> None:
    report = _report()
    report["a"] = {"error": "WorkerError: worker 0 exited"}
    report["c"] = {"error": "RuntimeError: no"}
    text = table(report)
    assert "failed: WorkerError: worker 0 exited" in text and "failed: RuntimeError: no" in text
    assert "B / A" not in text
    assert not isolated(report["c"])


@pytest.mark.slow
def test_a_small_host_run_measures_every_phase_and_prints_the_table_last(
    tmp_path: Path,
) -> None:
    out = tmp_path / "two.json"
    command = [sys.executable, str(BENCH / "two_devices.py"), "--backend", "host"]
    command += ["--clients", "2", "--seconds", "0.3", "--lead", "0.3", "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    report = json.loads(out.read_text())
    for phase in ("a", "b"):
        found = report[phase]
        assert "error" not in found, found.get("trace")
        assert found["per_second"] > 0 and found["errors"] == 0, found
        assert found["checked"] > 0 and found["max_full_check_error"] < 1e-5, found
    assert set(report["a"]["per_device"]) == {"0"}
    assert set(report["b"]["per_device"]) == {"0", "1"}
    c = report["c"]
    assert "error" not in c, c.get("trace")
    assert c["fault_session"] and c["device0_checked"]["before"] > 0, c
    assert done.returncode == (0 if isolated(c) else 1), done.stdout[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[-1].startswith("| C: after: same daemon instance"), done.stdout[-2000:]
