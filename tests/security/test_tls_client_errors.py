"""A client's TLS mistakes each named as what they are, not as "no accy daemon answered"."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from accy import Client, cli, errors
from accy.testing import Certificates, write_certificates
from tests.launch_service.harness import ServerThread, make_config


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Certificates]:
    folder = tmp_path_factory.mktemp("pki")
    # The daemon's certificate carries "accyd.test" alone: dialling 127.0.0.1 mismatches.
    return {
        "mine": write_certificates(folder / "mine", hosts=("accyd.test",)),
        "stranger": write_certificates(folder / "stranger"),
    }


@pytest.fixture(scope="module")
def mutual(
    tmp_path_factory: pytest.TempPathFactory, pki: dict[str, Certificates]
) -> Iterator[ServerThread]:
    mine = pki["mine"]
    running = ServerThread(
        make_config(
            tmp_path_factory.mktemp("mtls"),
            "tcp",
            insecure=True,
            tls_cert=mine.server_cert,
            tls_key=mine.server_key,
            tls_client_ca=mine.ca,
        )
    )
    yield running
    running.stop()


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    running = ServerThread(make_config(tmp_path_factory.mktemp("plain"), "tcp", insecure=True))
    yield running
    running.stop()


def refusal(target: str, **options: Any) -> errors.AccyError:
    with pytest.raises(errors.AccyError) as caught:
        Client(target, attach_timeout=5, **options).close()
    return caught.value


def test_the_right_certificates_work(mutual: ServerThread, pki: dict[str, Certificates]) -> None:
    mine = pki["mine"]
    with Client(
        mutual.address, tls_ca=mine.ca, tls_server_name="accyd.test", tls_cert=mine.client_cert,
        tls_key=mine.client_key,
    ) as client:  # fmt: skip
        assert client.pipelines()


def test_a_host_name_the_certificate_does_not_carry(
    mutual: ServerThread, pki: dict[str, Certificates], capsys: pytest.CaptureFixture[str]
) -> None:
    mine = pki["mine"]
    keys = {"tls_cert": mine.client_cert, "tls_key": mine.client_key}
    error = refusal(mutual.address, tls_ca=mine.ca, **keys)
    assert isinstance(error, errors.CertificateNameMismatch), error
    assert error.message.startswith(
        f"the TLS certificate of the daemon at {mutual.address} is not for the name dialled ("
    )
    assert error.message.endswith(
        "); dial a name the daemon's certificate carries (its subjectAltName), or give that "
        "name as the TLS server name"
    )
    flags = ["--tls-ca", str(mine.ca), "--tls-cert", str(mine.client_cert), "--tls-key"]
    assert cli.main(["--target", mutual.address, *flags, str(mine.client_key), "status"]) == 3
    err = capsys.readouterr().err
    assert err.endswith("; dial a name the daemon's certificate carries (its subjectAltName), "
                        "or pass that name with --tls-server-name\n")  # fmt: skip
    assert "accyd serve" not in err


@pytest.mark.parametrize("client_cert", ["none", "of another CA"])
def test_mutual_tls_without_a_client_certificate_of_its_ca(
    mutual: ServerThread, pki: dict[str, Certificates], client_cert: str
) -> None:
    mine, stranger = pki["mine"], pki["stranger"]
    keys: dict[str, Any] = {}
    if client_cert != "none":
        keys = {"tls_cert": stranger.client_cert, "tls_key": stranger.client_key}
    error = refusal(mutual.address, tls_ca=mine.ca, tls_server_name="accyd.test", **keys)
    assert isinstance(error, errors.ClientCertificateRefused), error
    assert error.message.startswith(f"the daemon at {mutual.address} ended the TLS handshake (")
    assert error.message.endswith(
        "): it serves mutual TLS and took no client certificate of this client; give a client "
        "certificate that its client CA signed, and its key"
    )
    assert "accyd serve" not in error.message


def test_tls_against_a_daemon_without_tls(
    plain: ServerThread, pki: dict[str, Certificates], capsys: pytest.CaptureFixture[str]
) -> None:
    error = refusal(plain.address, tls_ca=pki["stranger"].ca)
    assert isinstance(error, errors.DaemonWithoutTls), error
    assert error.message.startswith(f"the daemon at {plain.address} does not serve TLS (")
    assert error.message.endswith(
        "); connect without TLS, or serve TLS (accyd serve --tls-cert, --tls-key)"
    )
    ca = str(pki["stranger"].ca)
    assert cli.main(["--target", plain.address, "--tls-ca", ca, "pipelines"]) == 3
    err = capsys.readouterr().err
    assert err.endswith(
        "; leave out --tls, --tls-ca, --tls-cert and --tls-key for a daemon without TLS\n"
    )


def test_plain_text_against_a_daemon_of_tls_still_hints_tls(mutual: ServerThread) -> None:
    error = refusal(mutual.address)
    assert isinstance(error, errors.DaemonUnreachable)
    assert error.message.endswith(
        "; if it serves TLS, connect with TLS (tls_ca=, or tls=True for system roots)"
    )
