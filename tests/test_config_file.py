"""``accyd serve --config FILE``: TOML keys named as the flags, under variables and flags."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accy import cli as accy_cli
from accyd.cli import _config, main, parser
from accyd.settings.config import QUOTAS, SETTINGS, Config
from accyd.settings.config_file import read_config_file

FILE = """\
listen = ["unix:/run/a.sock", "127.0.0.1:7447"]
metrics-port = 9464
insecure = true
no-kserve = true
device-workers = false
quota-memory = "1GiB"
quota-buffers = 8
launch-spin-us = 50
grace = 3
"""


@pytest.fixture(autouse=True)
def no_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("ACCYD_"):
            monkeypatch.delenv(name)


def config_of(*flags: str) -> Config:
    return _config(parser().parse_args(["serve", *flags]))


def written(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "accyd.toml"
    path.write_text(text)
    return path


def test_the_file_sets_what_its_flags_would(tmp_path: Path) -> None:
    config = config_of("--config", str(written(tmp_path, FILE)))
    assert config.listen == ("unix:/run/a.sock", "127.0.0.1:7447")
    assert config.metrics_port == 9464
    assert config.insecure is True and config.kserve is False
    assert config.device_workers is False
    assert config.quotas.memory_bytes == 1 << 30 and config.quotas.buffers == 8
    assert config.launch_spin_seconds == 50e-6  # in the flag's unit, microseconds
    assert config.grace_seconds == 3.0
    # Each left out keeps its default.
    assert config.log_format == Config().log_format


def test_variables_win_over_the_file_and_flags_over_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = written(tmp_path, FILE)
    monkeypatch.setenv("ACCYD_GRACE_SECONDS", "5")
    monkeypatch.setenv("ACCYD_QUOTA_BUFFERS", "9")
    config = config_of("--config", str(path))
    assert (config.grace_seconds, config.quotas.buffers) == (5.0, 9)
    assert config.metrics_port == 9464  # no variable: the file's
    config = config_of("--config", str(path), "--grace", "7", "--quota-buffers", "10")
    assert (config.grace_seconds, config.quotas.buffers) == (7.0, 10)
    monkeypatch.setenv("ACCYD_CONFIG", str(path))  # the file named by its variable
    assert config_of().metrics_port == 9464


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("metrics_port = 1\n", "unknown key 'metrics_port'; did you mean 'metrics-port'? "
         "(the keys are accyd serve's flags, without --)"),
        ("frobnicate = 1\n", "unknown key 'frobnicate' (the keys are accyd serve's flags, "
         "without --; see accyd serve --help)"),
        ("metrics-port = 'x'\n", "metrics-port = 'x': invalid literal for int() with base 10: "
         "'x'"),
        ("grace = [1, 2]\n", "grace = [1, 2]: a list, where --grace takes one value"),
        ("[grace]\nseconds = 1\n", "grace = {'seconds': 1}: a table; each key is a flag's "
         "name at the top level of the file"),
        ("listen = \n", "not valid TOML: "),
    ],
)  # fmt: skip
def test_a_mistake_names_the_file_and_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = written(tmp_path, text)
    with pytest.raises(ValueError) as refused:
        config_of("--config", str(path))
    assert str(refused.value).startswith(f"{path}: {message}"), str(refused.value)


def test_serve_refuses_a_bad_file_in_one_line(tmp_path: Path) -> None:
    path = written(tmp_path, "listen = ['unix:/tmp/x.sock']\nno_kserve = true\n")
    done = subprocess.run(
        [sys.executable, "-m", "accyd.cli", "serve", "--config", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr == (
        f"accyd: {path}: unknown key 'no_kserve'; did you mean 'no-kserve'? (the keys are "
        "accyd serve's flags, without --)\n"
    )
    assert not done.stdout
    with pytest.raises(ValueError, match="cannot read the config file"):
        config_of("--config", str(tmp_path / "missing.toml"))


def test_serve_help_shows_the_config_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--config FILE read settings from this TOML file" in text
    assert "[env ACCYD_CONFIG; default none]" in text
    assert "a key in the --config file" in text


def test_a_daemon_serves_as_its_file_says(tmp_path: Path) -> None:
    socket = tmp_path / "from-file.sock"
    path = written(
        tmp_path,
        f'listen = ["unix:{socket}"]\nbackend = "host"\nno-supervise = true\n'
        f'cache-dir = "{tmp_path / "cache"}"\n',
    )
    daemon = subprocess.Popen(
        [sys.executable, "-m", "accyd.cli", "serve", "--config", str(path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while accy_cli.main(["--target", f"unix:{socket}", "health", "--timeout", "1"]) != 0:
            assert daemon.poll() is None, daemon.communicate()[1]
            assert time.monotonic() < deadline, "the daemon never served on the file's socket"
            time.sleep(0.2)
    finally:
        daemon.terminate()
        daemon.communicate(timeout=30)


def test_the_documented_example_reads(tmp_path: Path) -> None:
    text = (Path(__file__).parents[1] / "docs" / "operations.md").read_text()
    example = text.split("--config FILE` (or `ACCYD_CONFIG=FILE`)")[1].split("```toml\n")[1]
    settings, quotas = read_config_file(
        written(tmp_path, example.split("```")[0]), SETTINGS, QUOTAS
    )
    assert settings["listen"] == ("unix:/run/accy/accyd.sock", "0.0.0.0:7447")
    assert settings["kserve"] is True and quotas["memory_bytes"] == 8 << 30
