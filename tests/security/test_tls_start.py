"""TLS mistakes found at start, one line each; the documented test-certificate recipe works."""

from __future__ import annotations

import datetime
import re
import shutil
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from accy import Client
from accy.testing import write_certificates
from accyd.doors.grpc.tls import check_validity, server_credentials
from accyd.process.exits import EXIT_NEVER_READY
from tests.launch_service.harness import ServerThread, make_config

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def serve_once(tmp_path: Path, cert: Path, key: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "accyd.cli", "serve", "--no-supervise", "--backend", "host",
         "--listen", "127.0.0.1:0", "--insecure", "--tls-cert", str(cert), "--tls-key", str(key),
         "--log-format", "json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_key_of_another_certificate_is_refused_at_start_saying_so(tmp_path: Path) -> None:
    mine, other = write_certificates(tmp_path / "a"), write_certificates(tmp_path / "b")
    config = make_config(tmp_path, "tcp", tls_cert=mine.server_cert, tls_key=other.server_key)
    with pytest.raises(ValueError) as refused:
        server_credentials(config)
    assert str(refused.value) == (
        f"the TLS key {other.server_key} does not match the certificate {mine.server_cert}: "
        "give the key the certificate was made for"
    )
    done = serve_once(tmp_path, mine.server_cert, other.server_key)
    assert done.returncode == EXIT_NEVER_READY
    (line,) = done.stderr.strip().splitlines()  # one line, not "Failed to bind to address"
    assert "does not match the certificate" in line and "bind" not in line.lower(), line


def test_an_expired_certificate_is_refused_at_start_saying_when(tmp_path: Path) -> None:
    expired = write_certificates(tmp_path, server_days=-2)
    end = ssl.cert_time_to_seconds(
        ssl._ssl._test_decode_cert(str(expired.server_cert))["notAfter"]  # type: ignore[attr-defined]
    )
    day = datetime.datetime.fromtimestamp(end, datetime.UTC)
    config = make_config(tmp_path, "tcp", tls_cert=expired.server_cert, tls_key=expired.server_key)
    with pytest.raises(ValueError) as refused:
        server_credentials(config)
    assert str(refused.value) == (
        f"the TLS certificate {expired.server_cert} expired on "
        f"{day.strftime('%Y-%m-%d %H:%M')} UTC: renew it"
    )
    done = serve_once(tmp_path, expired.server_cert, expired.server_key)
    assert done.returncode == EXIT_NEVER_READY
    (line,) = done.stderr.strip().splitlines()
    assert "expired on" in line and "renew it" in line, line


def test_validity_at_its_edges(tmp_path: Path) -> None:
    certs = write_certificates(tmp_path, server_days=10)
    end = check_validity(certs.server_cert, "TLS certificate")
    with pytest.raises(ValueError, match=r"expired on .* UTC: renew it$"):
        check_validity(certs.server_cert, "TLS certificate", now=end)
    with pytest.raises(ValueError, match=r"is not valid until .* UTC: check this host's clock$"):
        check_validity(certs.server_cert, "TLS certificate", now=end - 30 * 86400)
    lasting = write_certificates(tmp_path / "lasting", server_days=60)
    with capture_logs() as logs:  # ten days left: served, with a warning; sixty: no warning
        check_validity(certs.server_cert, "TLS certificate")
        check_validity(lasting.server_cert, "TLS certificate")
    (warning,) = [entry for entry in logs if entry["log_level"] == "warning"]
    assert warning["event"] == "the TLS certificate expires soon: renew it"
    assert warning["path"] == str(certs.server_cert) and 9 < warning["days_left"] <= 10
    with pytest.raises(ValueError, match="is not a certificate OpenSSL can read"):
        check_validity(certs.server_key, "client CA")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl here")
def test_the_documented_recipe_makes_certificates_for_mutual_tls(tmp_path: Path) -> None:
    text = OPERATIONS.read_text()
    section = text.split("### Certificates for a test")[1]
    (recipe,) = re.findall(r"```sh\n(.*?)```", section.split("###")[0], flags=re.DOTALL)
    subprocess.run(["bash", "-euo", "pipefail", "-c", recipe], cwd=tmp_path, check=True,
                   capture_output=True, timeout=120)  # fmt: skip
    running = ServerThread(
        make_config(
            tmp_path,
            "tcp",
            insecure=True,
            tls_cert=tmp_path / "server.pem",
            tls_key=tmp_path / "server.key",
            tls_client_ca=tmp_path / "ca.pem",
        )
    )
    try:
        with Client(
            running.address, tls_ca=tmp_path / "ca.pem", tls_cert=tmp_path / "client.pem",
            tls_key=tmp_path / "client.key",
        ) as client:  # fmt: skip
            assert any(p.target == "accy.kernel.saxpy" for p in client.pipelines())
    finally:
        running.stop()
