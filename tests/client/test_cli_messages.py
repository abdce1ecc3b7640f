"""The accy CLI as a person meets it: version, Ctrl-C, health of a bogus service, each hint
said once, integer bounds in JSON, and a monitoring token running status and pipelines."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from accy import Client, Monitor, cli, errors
from tests.client.fake_daemon import FakeLaunchService
from tests.launch_service.harness import ServerThread, make_config
from tests.security.harness import TokenSpec, write_tokens


def test_version_of_both_commands() -> None:
    for module, name in (("accy.cli", "accy"), ("accyd.cli", "accyd")):
        done = subprocess.run(
            [sys.executable, "-m", module, "--version"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        words = done.stdout.split()
        assert words[0] == name and len(words) == 2 and words[1][0].isdigit(), done.stdout


def test_ctrl_c_ends_an_open_progress_line_and_says_interrupted(
    fake: tuple[str, FakeLaunchService],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def interrupted(client: object, args: argparse.Namespace) -> int:
        sys.stderr.write("\rupload x:  40% of 64.00 MiB")  # what _cli_run's progress writes
        raise KeyboardInterrupt

    monkeypatch.setitem(cli._COMMANDS, "run", interrupted)
    assert cli.main(["--target", fake[0], "run", "accy.kernel.device_scan", "--n", "4"]) == 130
    assert capsys.readouterr().err == "\rupload x:  40% of 64.00 MiB\naccy: interrupted\n"

    def before_any_output(client: object, args: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    monkeypatch.setitem(cli._COMMANDS, "run", before_any_output)
    assert cli.main(["--target", fake[0], "run", "accy.kernel.device_scan", "--n", "4"]) == 130
    assert capsys.readouterr().err == "accy: interrupted\n"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ServerThread, dict[str, str]]]:
    """A daemon whose every call needs a token: one that may launch, one for monitoring."""
    specs = {"worker": TokenSpec("team"), "monitor": TokenSpec("team", scopes=("status",))}
    tokens = write_tokens(tmp_path / "tokens.toml", specs)
    running = ServerThread(make_config(tmp_path, "unix", tokens_file=tmp_path / "tokens.toml"))
    yield running, tokens
    running.stop()


def test_health_of_a_service_it_does_not_serve_says_so(
    served: tuple[ServerThread, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    target = served[0].address
    assert cli.main(["--target", target, "health", "--service", "bogus"]) == cli.EXIT_DAEMON_ERROR
    err = capsys.readouterr().err
    assert err == (
        f"accy: the daemon at {target} reports no health for a service named 'bogus'; leave "
        "out --service for the whole server, or name a service it serves, such as "
        "accy.launch.v1.LaunchService\n"
    )
    assert (
        cli.main(["--target", target, "health", "--service", "accy.launch.v1.LaunchService"]) == 0
    )
    assert capsys.readouterr().out == "SERVING\n"


def test_a_status_token_runs_status_and_pipelines_without_attaching(
    served: tuple[ServerThread, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    running, tokens = served
    common = ["--target", running.address, "--token", tokens["monitor"]]
    assert cli.main([*common, "status", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["tenant"] == "team" and shown["clients"] == 0  # it did not attach
    assert cli.main([*common, "pipelines"]) == 0
    assert "accy.kernel.device_scan" in capsys.readouterr().out
    # Launching is not a monitoring token's: the refusal names the token's scopes.
    assert cli.main([*common, "run", "accy.kernel.device_scan", "--n", "4"]) == 4
    err = capsys.readouterr().err
    assert "this call needs the 'launch' scope; the token's scopes: 'status'" in err, err
    assert "tenant" not in err and err.count("scopes allow") == 1, err


def test_the_library_monitors_without_attaching_and_says_why_it_cannot_launch(
    served: tuple[ServerThread, dict[str, str]],
) -> None:
    running, tokens = served
    with Monitor(running.address, token=tokens["monitor"]) as monitor:
        assert monitor.status().tenant == "team"
        assert any(p.target == "accy.kernel.saxpy" for p in monitor.pipelines())
    with pytest.raises(errors.PermissionDenied) as refused:
        Client(running.address, token=tokens["monitor"], attach_timeout=5)
    assert refused.value.message == (
        "this call needs the 'launch' scope; the token's scopes: 'status'; give a token whose "
        "scopes allow this call (token= or ACCY_TOKEN)"
    )


def test_each_hint_is_said_once(
    served: tuple[ServerThread, dict[str, str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["--target", f"unix:{tmp_path}/none.sock", "status"]) == cli.EXIT_UNREACHABLE
    err = capsys.readouterr().err
    assert err.count("ACCY_TARGET") == 1 and err.count("accyd serve") == 1, err
    assert "--target" in err and "the target," not in err, err
    assert cli.main(["--target", "127.0.0.1:1", "--timeout", "1", "status"]) == 3
    err = capsys.readouterr().err
    assert err.count("if it serves TLS") == 1 and "--tls-ca" in err and "tls_ca=" not in err, err
    target = served[0].address
    assert cli.main(["--target", target, "pipelines"]) == cli.EXIT_DAEMON_ERROR
    err = capsys.readouterr().err
    assert err.count("ACCY_TOKEN") == 1 and "token=" not in err, err
    assert cli.main(["--target", target, "--token", "accy_wrong", "pipelines"]) == 4
    err = capsys.readouterr().err
    assert err == (
        "accy: UNAUTHENTICATED: the bearer token is not valid; pass one it accepts with --token "
        "(or ACCY_TOKEN) [UNAUTHENTICATED]\n"
    )


def test_json_bounds_of_integer_scalars_are_integers(
    fake: tuple[str, FakeLaunchService], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--target", fake[0], "pipelines", "--json"]) == 0
    out = capsys.readouterr().out
    (scalar,) = json.loads(out)[0]["runtime_scalars"]
    assert (scalar["min"], scalar["max"]) == (1, 2**30)
    assert type(scalar["min"]) is int and type(scalar["max"]) is int
    assert '"max": 1073741824' in out
