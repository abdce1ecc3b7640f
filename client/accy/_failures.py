"""A failed call's error made specific: an unreachable daemon, a token refused, a TLS mismatch."""

from __future__ import annotations

import grpc

from accy.errors import (
    AccyError,
    CertificateNameMismatch,
    CertificateNotVerified,
    ClientCertificateRefused,
    DaemonUnreachable,
    DaemonWithoutTls,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
    from_rpc_error,
    with_hint,
)

__all__ = ["CANCELLED_THERE", "specific", "translate"]


def _tls_refused(detail: str) -> bool:
    """Whether a connection failure's detail says the TLS handshake failed."""
    lowered = detail.lower()
    return "certificate_verify_failed" in lowered or "handshake failed" in lowered


def specific(failure: AccyError, *, target: str, secure: bool, has_token: bool) -> AccyError:
    """``failure`` of a call to ``target``, with what to do about it where the client knows."""
    if isinstance(failure, Unavailable) and failure.reason is None:
        detail = failure.message
        if secure and "WRONG_VERSION_NUMBER" in detail:  # plain text where TLS was spoken
            return DaemonWithoutTls(target, detail)
        if secure and "hostname verification" in detail.lower():
            return CertificateNameMismatch(target, detail)
        if secure and _tls_refused(detail):
            return CertificateNotVerified(target, detail)
        if secure and "socket closed" in detail.lower():
            # A daemon of mutual TLS ends the handshake of a client without a certificate
            # its CA signed; the client is told no more than this.
            return ClientCertificateRefused(target, detail)
        hint = None
        if not (target.startswith("unix:") or secure):
            hint = "if it serves TLS, connect with TLS (tls_ca=, or tls=True for system roots)"
        return DaemonUnreachable(target, detail, hint)
    if isinstance(failure, Unauthenticated):
        if has_token:
            return with_hint(failure, "the daemon refused the token given")
        return with_hint(failure, "this daemon wants a bearer token: give token= or set ACCY_TOKEN")
    if isinstance(failure, PermissionDenied):
        return with_hint(
            failure, "give a token whose scopes allow this call (token= or ACCY_TOKEN)"
        )
    return failure


CANCELLED_THERE = "CANCELLED_BY_DAEMON"
"""The reason of a call cancelled on the daemon's side (gRPC's own cancel as a server stops):
``Unavailable``, where ``Cancelled`` would read as if this process had cancelled it."""


def translate(error: grpc.RpcError, *, target: str, secure: bool, has_token: bool) -> AccyError:
    """The typed error of a failed call, made ``specific``."""
    if isinstance(error, grpc.Call) and error.code() == grpc.StatusCode.CANCELLED:
        cancelled = getattr(error, "cancelled", None)  # True where this process cancelled it
        if not (callable(cancelled) and cancelled()):
            return Unavailable(
                f"the daemon's side ended the call ({error.details() or 'CANCELLED'}), most "
                "likely as it stopped: nobody here cancelled it; retry (against its successor, "
                "if it restarts)",
                reason=CANCELLED_THERE,
            )
    return specific(from_rpc_error(error), target=target, secure=secure, has_token=has_token)
