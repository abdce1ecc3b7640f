"""TLS for the TCP listeners: server credentials from PEM files, mutual TLS with a client CA."""

from __future__ import annotations

from pathlib import Path

import grpc

from accyd.settings.config import Config

__all__ = ["server_credentials"]


def _pem(path: Path, what: str) -> bytes:
    try:
        data = path.expanduser().read_bytes()
    except OSError as error:
        raise ValueError(f"{path}: cannot read the {what}: {error.strerror}") from None
    if b"-----BEGIN " not in data:
        raise ValueError(f"{path}: the {what} is not PEM (no '-----BEGIN' line)")
    return data


def server_credentials(config: Config) -> grpc.ServerCredentials | None:
    """TLS credentials from ``tls_cert`` and ``tls_key``; ``None`` without them.

    With ``tls_client_ca`` a client must present a certificate that CA signed
    (mutual TLS); the handshake refuses any other.
    """
    if config.tls_cert is None or config.tls_key is None:
        return None
    pair = (_pem(config.tls_key, "TLS key"), _pem(config.tls_cert, "TLS certificate"))
    client_ca = config.tls_client_ca
    return grpc.ssl_server_credentials(
        [pair],
        root_certificates=None if client_ca is None else _pem(client_ca, "client CA"),
        require_client_auth=client_ca is not None,
    )
