"""A client's credentials: its bearer token (``ACCY_TOKEN``), TLS or mutual TLS for the channel."""

from __future__ import annotations

import os
from pathlib import Path

import grpc

from accy.protocol import AUTHORIZATION_METADATA

__all__ = [
    "TOKEN_ENV",
    "PemSource",
    "auth_metadata",
    "channel_credentials",
    "client_credentials",
    "read_pem",
    "resolve_token",
]

TOKEN_ENV = "ACCY_TOKEN"
"""The environment variable a client takes its bearer token from when given none."""

PemSource = str | os.PathLike[str] | bytes
"""PEM data: the bytes themselves, or the path of a file that holds them."""


def resolve_token(token: str | None) -> str | None:
    """``token``, else ``$ACCY_TOKEN``; blank means none (a token file's newline is dropped)."""
    value = token if token is not None else os.environ.get(TOKEN_ENV, "")
    return value.strip() or None


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The ``authorization: Bearer`` metadata entry for ``token``; none without one."""
    return ((AUTHORIZATION_METADATA, f"Bearer {token}"),) if token else ()


def read_pem(source: PemSource, what: str) -> bytes:
    """The bytes of ``source``; a path that cannot be read is a ``ValueError`` naming ``what``."""
    if isinstance(source, bytes):
        return source
    path = Path(source)
    try:
        return path.read_bytes()
    except OSError as error:
        raise ValueError(f"cannot read the {what} file {path}: {error.strerror}") from None


def channel_credentials(
    *,
    tls: bool = False,
    tls_ca: PemSource | None = None,
    tls_cert: PemSource | None = None,
    tls_key: PemSource | None = None,
) -> grpc.ChannelCredentials | None:
    """TLS credentials, or ``None`` for a plaintext channel.

    TLS is chosen by ``tls`` (trusting the system's roots), a CA (``tls_ca``),
    or a client certificate; mutual TLS needs both ``tls_cert`` and ``tls_key``.
    """
    if (tls_cert is None) != (tls_key is None):
        raise ValueError(
            "mutual TLS needs both a client certificate and its key (--tls-cert, --tls-key)"
        )
    if not tls and tls_ca is None and tls_cert is None:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=None if tls_ca is None else read_pem(tls_ca, "TLS CA"),
        private_key=None if tls_key is None else read_pem(tls_key, "TLS key"),
        certificate_chain=None if tls_cert is None else read_pem(tls_cert, "TLS certificate"),
    )


def client_credentials(
    credentials: grpc.ChannelCredentials | None,
    *,
    tls: bool,
    tls_ca: PemSource | None,
    tls_cert: PemSource | None,
    tls_key: PemSource | None,
) -> grpc.ChannelCredentials | None:
    """A client's channel credentials: ``credentials`` given, else the TLS options'
    (``channel_credentials``); both at once are refused."""
    if credentials is not None and (tls or tls_ca or tls_cert or tls_key):
        raise ValueError("pass either credentials or the tls options, not both")
    return credentials or channel_credentials(
        tls=tls, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key
    )
