"""TCP needs TLS and tokens unless --insecure; TLS and mutual TLS with generated certificates."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from accy.protocol.launch.v1 import launch_pb2 as pb
from accyd.settings.config import Config
from tests.launch_service.harness import ServerThread, make_config
from tests.security.certs import Authority, Issued
from tests.security.harness import Caller, TokenSpec, write_tokens


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Issued]:
    folder = tmp_path_factory.mktemp("pki")
    authority, stranger = Authority(folder), Authority(folder, "stranger CA")
    return {
        "ca": authority.root,
        "server": authority.issue("localhost", server=True),
        "client": authority.issue("client one", server=False),
        "stranger_ca": stranger.root,
        "stranger_client": stranger.issue("client two", server=False),
    }


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("tokens") / "tokens.toml"
    return path, write_tokens(path, {"a": TokenSpec("team-a")})["a"]


def tls_server(folder: Path, pki: dict[str, Issued], tokens: Path, *, mutual: bool) -> ServerThread:
    return ServerThread(
        make_config(
            folder,
            "tcp",
            insecure=False,
            tokens_file=tokens,
            tls_cert=pki["server"].cert_path,
            tls_key=pki["server"].key_path,
            tls_client_ca=pki["ca"].cert_path if mutual else None,
        )
    )


@pytest.fixture(scope="module")
def tls(
    tmp_path_factory: pytest.TempPathFactory, pki: dict[str, Issued], tokens: tuple[Path, str]
) -> Iterator[ServerThread]:
    running = tls_server(tmp_path_factory.mktemp("tls"), pki, tokens[0], mutual=False)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def mtls(
    tmp_path_factory: pytest.TempPathFactory, pki: dict[str, Issued], tokens: tuple[Path, str]
) -> Iterator[ServerThread]:
    running = tls_server(tmp_path_factory.mktemp("mtls"), pki, tokens[0], mutual=True)
    yield running
    running.stop()


def status_over(
    address: str, token: str, root: Issued, client: Issued | None = None
) -> pb.GetStatusResponse:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=root.cert,
        private_key=None if client is None else client.key,
        certificate_chain=None if client is None else client.cert,
    )
    with grpc.secure_channel(address, credentials) as channel:
        return Caller(channel, token).status()


def unavailable(call: object) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        call()  # type: ignore[operator]
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize(
    ("settings", "missing"),
    [
        ({}, ["--tls-cert", "--tokens"]),
        ({"tokens_file": Path("tokens.toml")}, ["--tls-cert"]),
        ({"tls_cert": Path("c.pem"), "tls_key": Path("k.pem")}, ["--tokens"]),
    ],
)
def test_tcp_without_tls_or_tokens_is_refused_naming_what_to_pass(
    settings: dict[str, object], missing: list[str]
) -> None:
    with pytest.raises(ValueError, match="--insecure") as caught:
        Config(listen=("127.0.0.1:7070",), **settings).validate()  # type: ignore[arg-type]
    for flag in missing:
        assert flag in str(caught.value)
    Config(listen=("127.0.0.1:7070",), insecure=True, **settings).validate()  # type: ignore[arg-type]
    Config(listen=("unix:/tmp/x.sock",), **settings).validate()  # type: ignore[arg-type]


def test_accyd_serve_refuses_plain_tcp_at_startup(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "accyd.cli", "serve", "--backend", "host", "--listen",
         "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--insecure" in done.stderr and "--tls-cert" in done.stderr


def test_tls_works_with_the_right_ca_and_fails_with_another(
    tls: ServerThread, pki: dict[str, Issued], tokens: tuple[Path, str]
) -> None:
    assert status_over(tls.address, tokens[1], pki["ca"]).tenant == "team-a"
    unavailable(lambda: status_over(tls.address, tokens[1], pki["stranger_ca"]))
    with grpc.insecure_channel(tls.address) as plain:  # no TLS at all
        unavailable(lambda: Caller(plain, tokens[1]).status())


def test_tls_still_needs_a_token(tls: ServerThread, pki: dict[str, Issued]) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        status_over(tls.address, "wrong", pki["ca"])
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_mutual_tls_refuses_clients_without_a_certificate_of_its_ca(
    mtls: ServerThread, pki: dict[str, Issued], tokens: tuple[Path, str]
) -> None:
    assert status_over(mtls.address, tokens[1], pki["ca"], pki["client"]).tenant == "team-a"
    unavailable(lambda: status_over(mtls.address, tokens[1], pki["ca"]))
    unavailable(lambda: status_over(mtls.address, tokens[1], pki["ca"], pki["stranger_client"]))


def test_unix_trusted_keeps_the_socket_tokenless_and_tcp_not(
    tmp_path: Path, tokens: tuple[Path, str]
) -> None:
    path, token = tokens
    listen = (f"unix:{tmp_path / 'accyd.sock'}", "127.0.0.1:0")
    running = ServerThread(
        make_config(
            tmp_path,
            "unix",
            listen=listen,
            tokens_file=path,
            unix_trusted=True,
            default_tenant="locals",
        )
    )
    try:
        unix, tcp = running.server.addresses
        with grpc.insecure_channel(unix) as channel:
            assert Caller(channel).status().tenant == "locals"
            assert Caller(channel, token).status().tenant == "team-a"
        with grpc.insecure_channel(tcp) as channel:
            with pytest.raises(grpc.RpcError) as caught:
                Caller(channel).status()
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert Caller(channel, token).status().tenant == "team-a"
    finally:
        running.stop()


def test_with_tokens_the_unix_socket_needs_them_too(
    tmp_path: Path, tokens: tuple[Path, str]
) -> None:
    running = ServerThread(make_config(tmp_path, "unix", tokens_file=tokens[0]))
    try:
        with grpc.insecure_channel(running.address) as channel:
            with pytest.raises(grpc.RpcError) as caught:
                Caller(channel).attach()
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        running.stop()
