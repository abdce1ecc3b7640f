"""A failed call's error made specific: an unreachable daemon, a token refused, a TLS mismatch."""

from __future__ import annotations

import grpc

from accy.errors import (
    AccyError,
    CertificateNotVerified,
    DaemonUnreachable,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
    from_rpc_error,
    with_hint,
)

__all__ = ["specific", "translate"]


def _tls_refused(detail: str) -> bool:
    """Whether a connection failure's detail says the TLS handshake failed."""
    lowered = detail.lower()
    return "certificate_verify_failed" in lowered or "handshake failed" in lowered


def specific(failure: AccyError, *, target: str, secure: bool, has_token: bool) -> AccyError:
    """``failure`` of a call to ``target``, with what to do about it where the client knows."""
    if isinstance(failure, Unavailable) and failure.reason is None:
        if secure and _tls_refused(failure.message):
            return CertificateNotVerified(target, failure.message)
        hint = None
        if not (target.startswith("unix:") or secure):
            hint = "if it serves TLS, connect with TLS (tls_ca=, or tls=True for system roots)"
        return DaemonUnreachable(target, failure.message, hint)
    if isinstance(failure, Unauthenticated):
        if has_token:
            return with_hint(failure, "the daemon refused the token given")
        return with_hint(failure, "this daemon wants a bearer token: give token= or set ACCY_TOKEN")
    if isinstance(failure, PermissionDenied):
        return with_hint(failure, "the token's scopes do not allow this call")
    return failure


def translate(error: grpc.RpcError, *, target: str, secure: bool, has_token: bool) -> AccyError:
    """The typed error of a failed call, made ``specific``."""
    return specific(from_rpc_error(error), target=target, secure=secure, has_token=has_token)
