"""With --log-format json every line of a supervised daemon's stderr is one JSON object,
gRPC's own lines about refused TLS handshakes included (they are kept off)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from accy import Client, errors
from accy.testing import running_daemon, write_certificates


def test_refused_handshakes_leave_the_json_log_json(tmp_path: Path) -> None:
    certs = write_certificates(tmp_path)
    flags = ["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
             "--tls-client-ca", str(certs.ca), "--log-format", "json"]  # fmt: skip
    with running_daemon(backend="host", extra=flags) as daemon:
        assert daemon.tcp_target is not None
        for _ in range(3):  # no client certificate: the daemon's C core refuses the handshake
            with pytest.raises(errors.ClientCertificateRefused):
                Client(daemon.tcp_target, tls_ca=certs.ca, attach_timeout=3)
        with Client(
            daemon.tcp_target, tls_ca=certs.ca, tls_cert=certs.client_cert,
            tls_key=certs.client_key,
        ) as client:  # fmt: skip
            assert client.pipelines()
        text = daemon.log.read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    assert any(json.loads(line).get("event") == "accyd serving" for line in lines)
    for line in lines:
        assert isinstance(json.loads(line), dict), line
