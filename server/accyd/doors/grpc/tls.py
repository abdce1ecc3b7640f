"""TLS for the TCP listeners: server credentials from PEM files, mutual TLS with a client CA.

Mistakes are found at start, each in one line that says which: a file that cannot be read
or is not PEM, a key that is not the certificate's (gRPC would say only "Failed to bind to
address"), a certificate or client CA past its end or before its start (gRPC would serve
an expired certificate without a word, and every client would fail to verify it). A
certificate that ends within ``EXPIRY_WARNING_DAYS`` is served, with a warning.
"""

from __future__ import annotations

import datetime
import ssl
import time
from pathlib import Path

import grpc
import structlog

from accyd.settings.config import Config

__all__ = ["EXPIRY_WARNING_DAYS", "check_validity", "server_credentials"]

EXPIRY_WARNING_DAYS = 30
"""A certificate that ends within this many days is served with a warning at start."""

log = structlog.get_logger("accyd.doors.grpc")


def _pem(path: Path, what: str) -> bytes:
    try:
        data = path.expanduser().read_bytes()
    except OSError as error:
        raise ValueError(f"{path}: cannot read the {what}: {error.strerror}") from None
    if b"-----BEGIN " not in data:
        raise ValueError(f"{path}: the {what} is not PEM (no '-----BEGIN' line)")
    return data


def _check_pair(cert: Path, key: Path) -> None:
    """Refuse a key that is not the certificate's (OpenSSL compares their public keys)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert.expanduser(), key.expanduser())
    except ssl.SSLError as error:
        if error.reason == "KEY_VALUES_MISMATCH":
            raise ValueError(
                f"the TLS key {key} does not match the certificate {cert}: give the key the "
                "certificate was made for"
            ) from None
        raise ValueError(
            f"{cert}, {key}: OpenSSL cannot load them as a TLS certificate and its key "
            f"({error.reason or error.strerror})"
        ) from None


def _when(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def check_validity(path: Path, what: str, now: float | None = None) -> float:
    """Refuse a certificate (the first in ``path``) past its end or before its start;
    warn of one that ends within ``EXPIRY_WARNING_DAYS``. Returns its end (epoch seconds)."""
    try:
        decoded = ssl._ssl._test_decode_cert(str(path.expanduser()))  # type: ignore[attr-defined]
    except ssl.SSLError as error:
        raise ValueError(
            f"{path}: the {what} is not a certificate OpenSSL can read ({error.args[-1]})"
        ) from None
    start = ssl.cert_time_to_seconds(decoded["notBefore"])
    end = ssl.cert_time_to_seconds(decoded["notAfter"])
    now = time.time() if now is None else now
    if now >= end:
        raise ValueError(f"the {what} {path} expired on {_when(end)}: renew it")
    if now < start:
        raise ValueError(
            f"the {what} {path} is not valid until {_when(start)}: check this host's clock"
        )
    days = (end - now) / 86400
    if days < EXPIRY_WARNING_DAYS:
        log.warning(
            f"the {what} expires soon: renew it", path=str(path), expires=_when(end),
            days_left=round(days, 1),
        )  # fmt: skip
    return end


def server_credentials(config: Config) -> grpc.ServerCredentials | None:
    """TLS credentials from ``tls_cert`` and ``tls_key``; ``None`` without them.

    With ``tls_client_ca`` a client must present a certificate that CA signed
    (mutual TLS); the handshake refuses any other.
    """
    if config.tls_cert is None or config.tls_key is None:
        return None
    pair = (_pem(config.tls_key, "TLS key"), _pem(config.tls_cert, "TLS certificate"))
    _check_pair(config.tls_cert, config.tls_key)
    check_validity(config.tls_cert, "TLS certificate")
    client_ca = config.tls_client_ca
    roots = None
    if client_ca is not None:
        roots = _pem(client_ca, "client CA")
        check_validity(client_ca, "client CA")
    return grpc.ssl_server_credentials(
        [pair], root_certificates=roots, require_client_auth=client_ca is not None
    )
