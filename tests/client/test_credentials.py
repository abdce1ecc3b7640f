"""Credentials: a bearer token on every call, refusals that say what to pass, TLS, mutual TLS."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from accy import cli, errors
from accy._credentials import channel_credentials, resolve_token
from accy.client import Client
from accy.testing import Certificates, write_certificates
from tests.client.fake_daemon import READ_ONLY, TOKEN, FakeLaunchService, serve, until

SCAN = "accy.kernel.device_scan"


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[tuple[str, FakeLaunchService]]:
    """A double that wants a bearer token."""
    target = f"unix:{tmp_path}/guarded.sock"
    server, service = serve(target, tokens=True)
    try:
        yield target, service
    finally:
        server.stop(grace=None)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return write_certificates(tmp_path_factory.mktemp("certs"))


def _tls_double(certs: Certificates, *, mutual: bool) -> tuple[grpc.Server, FakeLaunchService]:
    credentials = grpc.ssl_server_credentials(
        [(certs.server_key.read_bytes(), certs.server_cert.read_bytes())],
        root_certificates=certs.ca.read_bytes() if mutual else None,
        require_client_auth=mutual,
    )
    return serve("127.0.0.1:0", credentials=credentials)


def test_token_goes_on_every_call_attach_included(
    guarded: tuple[str, FakeLaunchService], monkeypatch: pytest.MonkeyPatch
) -> None:
    target, service = guarded
    monkeypatch.delenv("ACCY_TOKEN", raising=False)
    with Client(target, token=TOKEN) as client:
        session = client.load(SCAN)
        with client.empty(4, "f32") as x:
            session.launch([x], [x], n=4)
            x.read()
        client.status()
    methods = {method for method, _ in service.state.authorization}
    assert "Attach" in methods and "Launch" in methods
    assert {given for _, given in service.state.authorization} == {f"Bearer {TOKEN}"}


def test_token_from_the_environment(
    guarded: tuple[str, FakeLaunchService], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCY_TOKEN", f"{TOKEN}\n")  # as read from a file
    with Client(guarded[0]) as client:
        assert client.status().serving
    assert resolve_token(None) == TOKEN and resolve_token("") is None


def test_missing_token_says_what_to_pass(
    guarded: tuple[str, FakeLaunchService], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ACCY_TOKEN", raising=False)
    with pytest.raises(errors.Unauthenticated) as caught:
        Client(guarded[0])
    # The library says what to give in its own terms; flags are the CLI's to name.
    assert "token=" in str(caught.value) and "ACCY_TOKEN" in str(caught.value)
    assert "--" not in str(caught.value)
    with pytest.raises(errors.Unauthenticated, match="refused the token"):
        Client(guarded[0], token="wrong")


def test_permission_denied_says_what_to_pass(guarded: tuple[str, FakeLaunchService]) -> None:
    with Client(guarded[0], token=READ_ONLY) as client, client.empty(4, "f32") as x:
        session = client.load(SCAN)
        with pytest.raises(errors.PermissionDenied) as caught:
            session.launch([x], [x], n=4)
    assert caught.value.reason == "PERMISSION_DENIED" and "scopes" in str(caught.value)
    assert "--" not in str(caught.value)


def test_token_survives_a_reattach(guarded: tuple[str, FakeLaunchService]) -> None:
    target, service = guarded
    with Client(target, token=TOKEN) as client:
        service.restart()
        until(lambda: client.reattachments == 1)
        assert client.status().serving
    assert {given for _, given in service.state.authorization} == {f"Bearer {TOKEN}"}


def test_cli_token_and_refusal(
    guarded: tuple[str, FakeLaunchService],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("ACCY_TOKEN", raising=False)
    assert cli.main(["--target", guarded[0], "--token", TOKEN, "status"]) == 0
    assert cli.main(["--target", guarded[0], "status"]) == cli.EXIT_DAEMON_ERROR
    err = capsys.readouterr().err
    assert "UNAUTHENTICATED" in err and "--token" in err


def test_tls_with_a_ca_file_or_bytes(certificates: Certificates) -> None:
    server, service = _tls_double(certificates, mutual=False)
    target = f"localhost:{service.port}"
    try:
        with Client(target, tls_ca=certificates.ca) as client:
            assert client.status().serving
        ip = f"127.0.0.1:{service.port}"
        with Client(ip, tls_ca=certificates.ca.read_bytes()) as client:
            assert client.status().serving
        with pytest.raises(errors.DaemonUnreachable) as plain:
            Client(target, attach_timeout=5)
        assert "tls_ca=" in str(plain.value) and "--" not in str(plain.value)
        # tls=True trusts the system's roots, which did not sign this test CA's certificate.
        with pytest.raises(errors.CertificateNotVerified):
            Client(target, tls=True, attach_timeout=5)
    finally:
        server.stop(grace=None)


def test_a_wrong_ca_says_the_certificate_did_not_verify(
    certificates: Certificates, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server, service = _tls_double(certificates, mutual=False)
    target = f"localhost:{service.port}"
    other = write_certificates(tmp_path / "other")  # a CA that did not sign the daemon's
    try:
        with pytest.raises(errors.CertificateNotVerified) as caught:
            Client(target, tls_ca=other.ca, attach_timeout=5)
        assert "did not verify" in str(caught.value) and target in str(caught.value)
        assert "no accy daemon answered" not in str(caught.value)
        assert cli.main(["--target", target, "--tls-ca", str(other.ca), "status"]) == (
            cli.EXIT_UNREACHABLE
        )
        err = capsys.readouterr().err
        assert "did not verify" in err and "--tls-ca" in err
    finally:
        server.stop(grace=None)


def test_the_cli_names_its_flags_where_the_library_does_not(
    certificates: Certificates, capsys: pytest.CaptureFixture[str]
) -> None:
    server, service = _tls_double(certificates, mutual=False)
    try:
        assert cli.main(["--target", f"localhost:{service.port}", "status"]) == (
            cli.EXIT_UNREACHABLE
        )
        err = capsys.readouterr().err
        assert "--tls-ca" in err and "--target" in err
    finally:
        server.stop(grace=None)


def test_mutual_tls(certificates: Certificates, capsys: pytest.CaptureFixture[str]) -> None:
    server, service = _tls_double(certificates, mutual=True)
    target = f"localhost:{service.port}"
    try:
        with pytest.raises(errors.DaemonUnreachable):
            Client(target, tls_ca=certificates.ca, attach_timeout=5)
        with Client(
            target,
            tls_ca=certificates.ca,
            tls_cert=certificates.client_cert,
            tls_key=certificates.client_key,
        ) as client:
            assert client.status().serving
        flags = ["--target", target, "--tls-ca", str(certificates.ca)]
        mutual = [
            *flags,
            *("--tls-cert", str(certificates.client_cert)),
            *("--tls-key", str(certificates.client_key)),
        ]
        assert cli.main([*mutual, "status", "--json"]) == 0
        assert cli.main([*flags, "status"]) == cli.EXIT_UNREACHABLE
    finally:
        server.stop(grace=None)


def test_tls_options_are_checked(tmp_path: Path) -> None:
    assert channel_credentials() is None
    assert isinstance(channel_credentials(tls=True), grpc.ChannelCredentials)  # see above
    with pytest.raises(ValueError, match="both"):
        channel_credentials(tls_cert=b"x")
    with pytest.raises(ValueError, match="cannot read the TLS CA file"):
        channel_credentials(tls_ca=tmp_path / "missing.pem")
    with pytest.raises(ValueError, match="either"):
        Client("unix:/nowhere", tls=True, credentials=grpc.ssl_channel_credentials())
    with pytest.raises(SystemExit) as usage:
        cli.main(["--tls-cert", "c.pem", "status"])
    assert usage.value.code == 2
