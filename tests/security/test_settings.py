"""Security and operation settings: flags, environment, the token helpers of the accyd CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from accyd.backends.host import physical_memory
from accyd.cli import main, parser
from accyd.core.tenants import Quotas
from accyd.process.exits import EXIT_NEVER_READY
from accyd.settings.config import QUOTAS, SETTINGS, Config
from accyd.settings.fields import flag_values
from accyd.tokens import hash_token, new_token


def test_environment_and_flags_set_tokens_tls_metrics_and_quotas(tmp_path: Path) -> None:
    env = {
        "ACCYD_TOKENS_FILE": str(tmp_path / "tokens.toml"),
        "ACCYD_QUOTA_MEMORY_BYTES": "1024",
        "ACCYD_QUOTA_BUFFERS": "8",
        "ACCYD_METRICS_PORT": "9400",
        "ACCYD_SUPERVISE": "false",
    }
    config = Config.from_env(env, quotas={"buffers": 4, "sessions": 2}, unix_trusted=True)
    assert config.tokens_file == tmp_path / "tokens.toml"
    assert config.quotas == Quotas(memory_bytes=1024, sessions=2, buffers=4)
    assert (config.metrics_port, config.supervise, config.unix_trusted) == (9400, False, True)


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"tls_cert": Path("c.pem")}, "--tls-key"),
        ({"tls_client_ca": Path("ca.pem")}, "--tls-cert"),
        ({"metrics_port": 70000}, "metrics_port"),
        ({"quotas": Quotas(sessions=-1)}, "sessions"),
        ({"devices": (0, 1), "device_gpus": ((1, 0),), "device_workers": False}, "workers"),
        ({"devices": (0, 1), "device_gpus": ((2, 0),)}, r"not served .*\[2\]"),
    ],
)
def test_settings_that_cannot_work_are_refused(settings: dict[str, object], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        Config(listen=("unix:/tmp/x.sock",), **settings).validate()  # type: ignore[arg-type]


def test_quota_flags_take_sizes() -> None:
    args = parser().parse_args(["serve", "--quota-memory", "2GiB", "--quota-launches", "3"])
    assert (args.quota_memory, args.quota_launches) == (2 << 30, 3)
    assert parser().parse_args(["serve", "--quota-memory", "512"]).quota_memory == 512
    with pytest.raises(SystemExit):
        parser().parse_args(["serve", "--quota-memory", "lots"])


def test_hash_token_and_new_token(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hash-token", "s3cret"]) == 0
    assert capsys.readouterr().out.strip() == hash_token("s3cret")
    assert main(["new-token"]) == 0
    token_line, hash_line = capsys.readouterr().out.splitlines()
    token = token_line.split()[-1]
    assert len(token) >= 40 and hash_line.split()[-1] == hash_token(token)


def test_a_new_token_never_reads_as_a_flag() -> None:
    # token_urlsafe starts with "-" one time in 64: `accy --token -x...` then fails.
    tokens = [new_token() for _ in range(2000)]
    assert not any(token.startswith("-") for token in tokens)
    assert len(set(tokens)) == len(tokens)


def test_hash_token_reads_stdin() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "accyd.cli", "hash-token"],
        input="s3cret\n", capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == hash_token("s3cret")


def test_an_unreadable_tls_key_stops_the_server_with_its_path(tmp_path: Path) -> None:
    cert = tmp_path / "server.crt"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    done = subprocess.run(
        [sys.executable, "-m", "accyd.cli", "serve", "--no-supervise", "--backend", "host",
         "--listen", f"unix:{tmp_path / 's.sock'}", "--tls-cert", str(cert),
         "--tls-key", str(tmp_path / "missing.key")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == EXIT_NEVER_READY  # a restart would fail the same way
    assert "missing.key" in done.stderr


def test_serve_help_names_every_setting_with_its_variable_and_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for bound in (*SETTINGS, *QUOTAS):
        assert bound.flag in text
        assert f"[env {bound.env}; default" in text
    assert "--grace SECONDS drain time at shutdown" in text
    assert "[env ACCYD_GRACE_SECONDS; default 10.0]" in text


@pytest.mark.parametrize(
    ("flags", "env", "field", "value"),
    [
        (["--grace", "3"], {"ACCYD_GRACE_SECONDS": "3"}, "grace_seconds", 3.0),
        (["--launch-spin-us", "50"], {"ACCYD_LAUNCH_SPIN_SECONDS": "0.00005"},
         "launch_spin_seconds", 50e-6),
        (["--listen", "unix:/a", "--listen", "unix:/b"], {"ACCYD_LISTEN": "unix:/a,unix:/b"},
         "listen", ("unix:/a", "unix:/b")),
        (["--no-supervise"], {"ACCYD_SUPERVISE": "false"}, "supervise", False),
        (["--host-memory-limit", "2GiB"], {"ACCYD_HOST_MEMORY_LIMIT": "2GiB"},
         "host_memory_limit", 2 << 30),
        (["--keepalive-seconds", "7"], {"ACCYD_KEEPALIVE_SECONDS": "7"}, "keepalive_seconds", 7),
    ],
)  # fmt: skip
def test_a_flag_and_its_variable_set_the_same_setting(
    flags: list[str], env: dict[str, str], field: str, value: object
) -> None:
    args = parser().parse_args(["serve", *flags])
    from_flags = Config.from_env({}, **flag_values(args, SETTINGS))
    from_env = Config.from_env(env)
    assert getattr(from_flags, field) == getattr(from_env, field) == value


def test_a_flag_wins_over_its_variable() -> None:
    args = parser().parse_args(["serve", "--grace", "1", "--quota-sessions", "2"])
    env = {"ACCYD_GRACE_SECONDS": "9", "ACCYD_QUOTA_SESSIONS": "5", "ACCYD_QUOTA_BUFFERS": "4"}
    config = Config.from_env(env, quotas=flag_values(args, QUOTAS), **flag_values(args, SETTINGS))
    assert config.grace_seconds == 1.0
    assert (config.quotas.sessions, config.quotas.buffers) == (2, 4)


def test_a_bad_variable_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="ACCYD_GRACE_SECONDS='soon'"):
        Config.from_env({"ACCYD_GRACE_SECONDS": "soon"})
    with pytest.raises(ValueError, match=r"ACCYD_BACKEND='gpu'.*auto, cuda, host"):
        Config.from_env({"ACCYD_BACKEND": "gpu"})


def test_the_host_memory_limit_takes_a_share_of_physical_memory() -> None:
    config = Config.from_env({"ACCYD_HOST_MEMORY_LIMIT": "25%"})
    assert config.host_memory_limit == physical_memory() // 4
    with pytest.raises(ValueError, match="share"):
        Config.from_env({"ACCYD_HOST_MEMORY_LIMIT": "150%"})


def test_devices_workers_and_their_gpus_from_flags_and_the_environment() -> None:
    assert not Config().uses_device_workers  # one device: in this process
    assert Config(devices=(0, 1)).uses_device_workers  # more: a worker each
    assert not Config(devices=(0, 1), device_workers=False).uses_device_workers
    args = parser().parse_args(["serve", "--device", "0", "--device", "1", "--device-gpu", "1=0"])
    flags = Config.from_env({}, **flag_values(args, SETTINGS))
    env = Config.from_env({"ACCYD_DEVICES": "0,1", "ACCYD_DEVICE_GPUS": "1=0"})
    for config in (flags, env):
        assert (config.devices, config.device_gpus) == ((0, 1), ((1, 0),))
        assert (config.gpu_of(0), config.gpu_of(1), config.uses_device_workers) == (0, 0, True)
    with pytest.raises(SystemExit):
        parser().parse_args(["serve", "--device-gpu", "1"])
