"""The accy CLI: argument parsing, exit codes, and `run` against the service double."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import numpy as np
import pytest

from accy import Client, TenantStatus, _cli_run, cli, references
from accy.protocol.launch.v1 import launch_pb2 as pb
from tests.client.fake_daemon import FakeLaunchService


def test_parser_reads_the_run_interface() -> None:
    args = cli.build_parser().parse_args(
        [
            "--target",
            "unix:/x",
            "run",
            "p",
            "--n",
            "5",
            "--scalar",
            "a=2.5",
            "--scalar",
            "b = 1",
            "--check",
            "--repeat",
            "3",
            "--json",
        ]
    )
    assert (args.target, args.command, args.pipeline, args.n) == ("unix:/x", "run", "p", 5)
    assert args.scalar == [("a", "2.5"), ("b", "1")]
    assert args.check and args.json and args.repeat == 3 and args.seed == 0


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["run"],
        ["run", "p", "--scalar", "novalue"],
        ["run", "p", "--n", "x"],
        ["run", "p", "--repeat", "0"],
    ],
)
def test_usage_errors_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(argv)
    assert caught.value.code == 2


def test_unreachable_daemon_is_one_line_and_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["--target", "unix:/nonexistent/accy.sock", "status"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_UNREACHABLE
    assert err.count("\n") == 1
    assert "unix:/nonexistent/accy.sock" in err and "accyd serve" in err


def test_run_check_json(
    fake: tuple[str, FakeLaunchService], capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(
        [
            "--target",
            fake[0],
            "run",
            "accy.kernel.device_scan",
            "--n",
            "3000",
            "--check",
            "--repeat",
            "3",
            "--json",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["ok"] and report["check"][0]["result"] == "y"
    assert report["scalars"] == {"n": 3000}
    assert len(report["launch_seconds"]) == 3
    assert report["bytes_uploaded"] == 12000 == report["bytes_downloaded"]
    assert not fake[1].state.buffers and not fake[1].state.sessions  # freed and released


def test_run_text_table(
    fake: tuple[str, FakeLaunchService], capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        cli.main(["--target", fake[0], "run", "accy.kernel.device_scan", "--n", "10", "--check"])
        == 0
    )
    out = capsys.readouterr().out
    for phase in ("upload", "launch p50", "download", "check y"):
        assert phase in out


def test_run_refuses_unknown_scalar_and_missing_integer(
    fake: tuple[str, FakeLaunchService], capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        cli.main(
            ["--target", fake[0], "run", "accy.kernel.device_scan", "--n", "4", "--scalar", "q=1"]
        )
        == 2
    )
    assert "no runtime scalar 'q'" in capsys.readouterr().err
    assert cli.main(["--target", fake[0], "run", "accy.kernel.device_scan"]) == 2
    assert "--scalar n=VALUE" in capsys.readouterr().err


@pytest.mark.parametrize("n", ["5000000000", "0"])
def test_run_checks_a_scalar_against_its_bounds_before_making_inputs(
    fake: tuple[str, FakeLaunchService], capsys: pytest.CaptureFixture[str], n: str
) -> None:
    # 5e9 elements would be 20 GB of inputs, made before the daemon could refuse them.
    argv = ["--target", fake[0], "run", "accy.kernel.device_scan", "--n", n]
    assert cli.main(argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"runtime scalar 'n' is {n}; accy.kernel.device_scan accepts 1..1073741824" in err
    assert not fake[1].state.launches and not fake[1].state.buffers  # nothing made or sent


def test_run_daemon_refusal_exit_4(
    fake: tuple[str, FakeLaunchService], capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        cli.main(["--target", fake[0], "run", "no.such.pipeline", "--n", "4"])
        == cli.EXIT_DAEMON_ERROR
    )
    assert "NOT_FOUND" in capsys.readouterr().err


def test_pipelines_and_status(
    fake: tuple[str, FakeLaunchService], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--target", fake[0], "pipelines"]) == 0
    assert "accy.kernel.device_scan" in capsys.readouterr().out
    assert cli.main(["--target", fake[0], "pipelines", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["operands"][0]["extent"] == "n"
    assert cli.main(["--target", fake[0], "status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["backend"] == "fake"


def test_status_text_shows_every_field() -> None:
    fields = {
        "target": "unix:/s",
        "serving": True,
        "uptime_seconds": 2.5,
        "device_memory_in_use": 3 << 20,
        "restarts": 2,
        "tenants": [
            {
                "name": "alice",
                "memory_bytes": 4096,
                "quotas": {"sessions": 3, "buffers": None},
                "quota_refusals": {"sessions": 7},
            }
        ],
        "by_device": {"0": 12},
        "empty": [],
    }
    text = cli.status_text(fields)
    assert "3145728 (3.00 MiB)" in text and "2.50 s" in text
    assert "restarts" in text and "by_device.0" in text and "empty: none" in text
    header, row = text.split("tenants:\n")[1].split("\n\n")[0].splitlines()
    assert header.split() == [
        "name",
        "memory_bytes",
        "quotas.sessions",
        "quotas.buffers",
        "quota_refusals.sessions",
    ]
    assert row.split() == ["alice", "4096", "(4.00", "KiB)", "3", "-", "7"]


def test_status_shows_fields_this_client_does_not_name(
    fake: tuple[str, FakeLaunchService], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--target", fake[0], "status"]) == 0
    out = capsys.readouterr().out
    for name in ("instance_id", "my_buffers", "tenant"):
        assert name in out
    assert cli.main(["--target", fake[0], "status", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert set(pb.GetStatusResponse.DESCRIPTOR.fields_by_name) <= set(shown)


def test_health_unreachable_exit_3() -> None:
    assert cli.main(["--target", "unix:/nonexistent/accy.sock", "health", "--timeout", "1"]) == 3


def test_references() -> None:
    x = np.random.default_rng(0).random(1000).astype(np.float32)
    ref = references.find("accy.kernel.device_scan")
    assert ref is not None and references.find("unknown.target") is None
    (ok,) = references.compare(ref, [x], [np.cumsum(x)], {"n": 1000})
    assert ok.ok and ok.tolerance == 1e-5
    (bad,) = references.compare(ref, [x], [np.cumsum(x)[::-1]], {"n": 1000})
    assert not bad.ok
    saxpy = references.REFERENCES["accy.kernel.saxpy"]
    y = np.ones(1000, np.float32)
    (good,) = references.compare(saxpy, [x, y], [np.float32(2) * x + y], {"n": 1000, "a": 2.0})
    assert good.ok
    total = references.REFERENCES["accy.kernel.reduce_sum"]
    assert references.compare(total, [x], [np.array([x.sum()])], {"n": 1000})[0].ok
    assert references.relative_l2(np.zeros(2), np.zeros(3)) == float("inf")


def test_progress_only_for_large_transfers_on_a_terminal() -> None:
    import io

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert _cli_run._progress("upload x", 64 << 20, io.StringIO()) is None
    assert _cli_run._progress("upload x", 1 << 20, Terminal()) is None
    stream = Terminal()
    report = _cli_run._progress("upload x", 64 << 20, stream)
    assert report is not None
    report(1 << 20, 64 << 20)
    report(64 << 20, 64 << 20)
    assert stream.getvalue().endswith("upload x: 100% of 64.00 MiB\n")


def test_status_does_not_count_the_command_itself(
    fake: tuple[str, FakeLaunchService], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--target", fake[0], "status", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["clients"] == 0 and shown["tenants"][0]["clients"] == 0
    assert shown["tenants"][0]["quotas"]["buffers"] == 64


def test_status_has_typed_tenants_quotas_and_restarts(
    client: Client, fake: tuple[str, FakeLaunchService]
) -> None:
    fake[1].restart()
    client.wait_attached(10)
    status = client.status()
    (tenant,) = status.tenants
    assert isinstance(tenant, TenantStatus) and tenant.name == status.tenant == "local"
    assert (tenant.clients, tenant.quotas.buffers, tenant.quotas.memory_bytes) == (1, 64, None)
    assert tenant.quota_refusals == {"buffers": 1} and status.quota_refusals == 1
    assert status.restarts == 1 and status.device_faults == 0
    assert status.extra == {}


def test_timeout_before_the_subcommand_is_kept(tmp_path: Path) -> None:
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # listens, never answers
    path = tmp_path / "silent.sock"
    silent.bind(str(path))
    silent.listen()
    try:
        for argv in (["--timeout", "0.5", "health"], ["health", "--timeout", "0.5"]):
            started = time.monotonic()
            assert cli.main(["--target", f"unix:{path}", *argv]) == cli.EXIT_UNREACHABLE
            assert time.monotonic() - started < 2.5, argv  # not the subcommand's default 3 s
    finally:
        silent.close()
    args = cli.build_parser().parse_args(["--timeout", "9", "health"])
    assert args.timeout == 9


def test_check_without_a_reference_fails_and_says_so(
    fake: tuple[str, FakeLaunchService],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(references.REFERENCES, "accy.kernel.device_scan")
    argv = ["--target", fake[0], "run", "accy.kernel.device_scan", "--n", "8", "--check"]
    assert cli.main(argv) == cli.EXIT_CHECK_FAILED
    captured = capsys.readouterr()
    assert "no reference is known for accy.kernel.device_scan" in captured.err
    assert "NOT CHECKED" in captured.out
    assert cli.main([*argv[:-1], "--json"]) == 0  # without --check there is nothing to fail
