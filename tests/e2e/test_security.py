"""The client against a daemon that wants credentials: bearer tokens, TLS and mutual TLS."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from accy import Client, errors
from accy.testing import Certificates, running_daemon, write_certificates
from accyd.tokens import new_token
from tests.e2e.flags import needs_flag

SCAN = "accy.kernel.device_scan"
LAUNCH_TOKEN = new_token()  # never starts with "-", which the CLI would take for a flag
ADMIN_ONLY_TOKEN = new_token()


def _tokens_file(folder: Path) -> Path:
    path = folder / "tokens.toml"
    entries = [("team-a", LAUNCH_TOKEN, '["launch"]'), ("ops", ADMIN_ONLY_TOKEN, '["admin"]')]
    path.write_text(
        "".join(
            f'[[token]]\ntenant = "{tenant}"\n'
            f'sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\nscopes = {scopes}\n'
            for tenant, token, scopes in entries
        )
    )
    return path


def _accy(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", "import sys; from accy.cli import main; sys.exit(main())"]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def _scan(client: Client, n: int = 1000) -> None:
    x = np.random.default_rng(n).random(n, dtype=np.float32)
    (y,) = client.run(SCAN, x)
    np.testing.assert_allclose(y, np.cumsum(x, dtype=np.float64), rtol=1e-4)


@needs_flag("--tokens")
def test_bearer_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCY_TOKEN", raising=False)
    with running_daemon(tcp=False, extra=("--tokens", str(_tokens_file(tmp_path)))) as daemon:
        target = daemon.unix_target
        with pytest.raises(errors.Unauthenticated) as missing:
            Client(target)
        assert "token=" in str(missing.value) and "ACCY_TOKEN" in str(missing.value)
        with pytest.raises(errors.Unauthenticated, match="refused the token"):
            Client(target, token="not-a-token")
        with pytest.raises(errors.PermissionDenied) as scope:
            Client(target, token=ADMIN_ONLY_TOKEN)
        assert "scopes" in str(scope.value) and "--" not in str(scope.value)

        with Client(target, token=LAUNCH_TOKEN, reattach_timeout=120) as client:
            assert client.attachment.tenant == "team-a"
            _scan(client)
            assert client.status().to_dict().get("tenant", "team-a") == "team-a"
            daemon.restart()  # the token goes on the new Attach too
            deadline = time.monotonic() + 120
            while client.reattachments < 1:
                assert time.monotonic() < deadline, "no reattach"
                time.sleep(0.02)
            _scan(client)
        monkeypatch.setenv("ACCY_TOKEN", LAUNCH_TOKEN)
        with Client(target) as client:
            assert client.attachment.tenant == "team-a"

        env = {k: v for k, v in os.environ.items() if k != "ACCY_TOKEN"}
        env["ACCY_TARGET"] = target
        refused = _accy("status", env=env)
        assert refused.returncode == 4 and "--token" in refused.stderr
        done = _accy("--token", LAUNCH_TOKEN, "status", "--json", env=env)
        assert done.returncode == 0, done.stderr
        assert '"tenant": "team-a"' in done.stdout
        done = _accy("run", SCAN, "--n", "1000", "--check", env={**env, "ACCY_TOKEN": LAUNCH_TOKEN})
        assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return write_certificates(tmp_path_factory.mktemp("certs"))


@needs_flag("--tls-cert")
def test_tls(certificates: Certificates) -> None:
    certs = certificates
    flags = ("--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key))
    with running_daemon(extra=flags) as daemon:
        assert daemon.tcp_target is not None
        with Client(daemon.tcp_target, tls_ca=certs.ca) as client:
            _scan(client)
        with pytest.raises(errors.DaemonUnreachable) as plaintext:
            Client(daemon.tcp_target, attach_timeout=5)
        assert "tls_ca=" in str(plaintext.value)
        env = dict(os.environ, ACCY_TARGET=daemon.tcp_target)
        done = _accy("--tls-ca", str(certs.ca), "health", env=env)
        assert done.stdout.strip() == "SERVING", done.stderr


@needs_flag("--tls-client-ca")
def test_mutual_tls(certificates: Certificates) -> None:
    certs = certificates
    flags = (
        *("--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)),
        *("--tls-client-ca", str(certs.ca)),
    )
    with running_daemon(extra=flags) as daemon:
        assert daemon.tcp_target is not None
        with pytest.raises(errors.DaemonUnreachable):
            Client(daemon.tcp_target, tls_ca=certs.ca, attach_timeout=5)
        with Client(
            daemon.tcp_target,
            tls_ca=certs.ca,
            tls_cert=certs.client_cert,
            tls_key=certs.client_key,
        ) as client:
            _scan(client)
        env = dict(os.environ, ACCY_TARGET=daemon.tcp_target)
        mutual = ("--tls-ca", str(certs.ca), "--tls-cert", str(certs.client_cert))
        done = _accy(*mutual, "--tls-key", str(certs.client_key), "status", env=env)
        assert done.returncode == 0, done.stderr
