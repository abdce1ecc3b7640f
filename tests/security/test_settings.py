"""Security and operation settings: flags, environment, the token helpers of the accyd CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from accyd.auth import hash_token, new_token
from accyd.cli import main, parser
from accyd.config import Config
from accyd.core.tenants import Quotas


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
    assert done.returncode == 1
    assert "missing.key" in done.stderr
