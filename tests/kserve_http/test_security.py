"""The HTTP door's listeners as the gRPC ones: TCP needs TLS and tokens unless --insecure,
TLS from the same certificate (mutual TLS with the same client CA), and the same tokens."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from accy.testing import free_port, running_daemon, write_certificates
from accyd.settings.config import Config
from tests.kserve.harness import TENANTS
from tests.kserve_http.harness import simple_inputs
from tests.security.harness import write_tokens


def test_tcp_without_tls_and_tokens_is_refused_unless_insecure() -> None:
    with pytest.raises(ValueError, match=r"refusing to serve 127\.0\.0\.1:8000 over TCP"):
        Config.from_env({}, kserve_http_listen=("127.0.0.1:8000",))
    Config.from_env({}, kserve_http_listen=("127.0.0.1:8000",), insecure=True)
    with pytest.raises(ValueError, match="--no-kserve"):
        Config.from_env({}, kserve_http_listen=("unix:/tmp/x",), kserve=False)


def test_https_with_mutual_tls_and_a_token(tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    certs = write_certificates(tmp_path / "certs")
    tokens = write_tokens(tmp_path / "tokens.toml", TENANTS)
    port = free_port()
    extra = [
        "--no-supervise", "--tokens", str(tmp_path / "tokens.toml"),
        "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
        "--tls-client-ca", str(certs.ca), "--kserve-http-listen", f"127.0.0.1:{port}",
    ]  # fmt: skip
    with running_daemon(backend="host", tcp=False, extra=extra, insecure=False):
        url = f"https://127.0.0.1:{port}/v2/health/ready"
        context = ssl.create_default_context(cafile=str(certs.ca))
        headers = {"Authorization": f"Bearer {tokens['alpha']}"}
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # no client certificate
            urllib.request.urlopen(urllib.request.Request(url, headers=headers), context=context)
        context.load_cert_chain(str(certs.client_cert), str(certs.client_key))
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, context=context, timeout=30) as answer:
            assert json.loads(answer.read()) == {"ready": True}
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, context=context, timeout=30)
        assert refused.value.code == 401


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl here")
def test_a_unix_socket_listener_is_one_daemons(tmp_path: Path) -> None:
    """``unix:/path``: served (0660), infer works; the path is claimed as --listen's are."""
    socket = tmp_path / "http.sock"
    extra = ["--no-supervise", "--kserve-http-listen", f"unix:{socket}"]
    with running_daemon(backend="host", tcp=False, extra=extra):
        assert socket.stat().st_mode & 0o777 == 0o660
        body = json.dumps({"inputs": simple_inputs([1] * 16, [2] * 16)})
        done = subprocess.run(
            ["curl", "-sf", "--unix-socket", str(socket), "-d", body,
             "http://accyd/v2/models/simple/infer"],
            capture_output=True, check=True, timeout=60,
        )  # fmt: skip
        assert json.loads(done.stdout)["outputs"][0]["data"] == [3] * 16
        second = Config.from_env({}, kserve_http_listen=(f"unix:{socket}",))
        assert second.kserve_http_listen == (f"unix:{socket}",)  # no TCP: no --insecure needed
        with (
            pytest.raises(Exception, match="another daemon"),
            running_daemon(backend="host", tcp=False, extra=extra, ready_timeout=20),
        ):
            pass
    assert not socket.exists()  # removed at stop
