"""Typed exceptions that mirror gRPC status codes, decoded from google.rpc details."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import grpc
from google.rpc.error_details_pb2 import (  # type: ignore[import-untyped, unused-ignore]
    BadRequest,
    ErrorInfo,
    QuotaFailure,
    RequestInfo,
)
from google.rpc.status_pb2 import Status as RpcStatus  # type: ignore[import-untyped, unused-ignore]
from grpc_status import rpc_status

from accy.protocol import ERROR_DOMAIN

__all__ = [
    "DOMAIN",
    "Aborted",
    "AccyError",
    "AlreadyExists",
    "BufferLost",
    "Cancelled",
    "CertificateNameMismatch",
    "CertificateNotVerified",
    "ClientCertificateRefused",
    "ClientClosed",
    "DaemonUnreachable",
    "DaemonWithoutTls",
    "DataLoss",
    "DeadlineExceeded",
    "FailedPrecondition",
    "FieldViolation",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "OutOfRange",
    "PermissionDenied",
    "QuotaViolation",
    "ResourceExhausted",
    "SessionLost",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "Unknown",
    "error_class",
    "from_rpc_error",
    "from_rpc_status",
    "from_status",
    "with_hint",
]

DOMAIN = ERROR_DOMAIN
"""The ``ErrorInfo.domain`` of every error the daemon raises."""


@dataclass(frozen=True, slots=True)
class FieldViolation:
    """One ``google.rpc.BadRequest`` field violation: the request field at fault and why."""

    field: str
    description: str


@dataclass(frozen=True, slots=True)
class QuotaViolation:
    """One ``google.rpc.QuotaFailure`` violation: which quota and why."""

    subject: str
    description: str


class AccyError(Exception):
    """Base of every error the client raises for a failed call.

    ``code`` is the gRPC status code; ``reason`` and ``metadata`` come from the
    daemon's ``google.rpc.ErrorInfo`` (``None`` and empty when it sent none);
    ``request_id`` from its ``RequestInfo``, the key to the daemon's log.
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        domain: str | None = None,
        metadata: Mapping[str, str] | None = None,
        field_violations: Sequence[FieldViolation] = (),
        quota_violations: Sequence[QuotaViolation] = (),
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.domain = domain
        self.metadata: dict[str, str] = dict(metadata or {})
        self.field_violations = tuple(field_violations)
        self.quota_violations = tuple(quota_violations)
        self.request_id = request_id
        self.hint = ""
        """What to do about it, where the client knows: the end of ``message`` (``with_hint``)."""

    @property
    def bare(self) -> str:
        """``message`` without its ``hint``: what went wrong alone."""
        if self.hint and self.message.endswith(f"; {self.hint}"):
            return self.message[: -len(self.hint) - 2]
        return self.message

    @property
    def fields(self) -> tuple[str, ...]:
        """The request fields named at fault, in the order the daemon gave them."""
        return tuple(v.field for v in self.field_violations)

    def __str__(self) -> str:
        text = f"{self.code.name}: {self.message}"
        if self.reason:
            text += f" [{self.reason}]"
        for violation in self.field_violations:
            if violation.description == self.message:
                text += f" (field {violation.field})"
            else:
                text += f"\n  {violation.field}: {violation.description}"
        return text


class Cancelled(AccyError):
    """The call was cancelled by the caller (one cancelled on the daemon's side is
    ``Unavailable``: ``accy._failures``)."""

    code = grpc.StatusCode.CANCELLED


class Unknown(AccyError):
    """A status the daemon did not classify."""

    code = grpc.StatusCode.UNKNOWN


class InvalidArgument(AccyError):
    """A request that can never succeed as written; ``field_violations`` name the fields."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(AccyError):
    """The call's deadline passed before it finished."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(AccyError):
    """An id or name this client cannot see: unknown, freed, or another client's."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(AccyError):
    """Something created twice."""

    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(AccyError):
    """Credentials that lack the scope the call needs."""

    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(AccyError):
    """A quota or a device limit; ``quota`` names the quota where the daemon said which."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    @property
    def quota(self) -> str | None:
        if self.quota_violations:
            return self.quota_violations[0].subject
        return self.metadata.get("quota")


class FailedPrecondition(AccyError):
    """A valid call in the wrong state (for example scratch allocated too small)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class ClientClosed(FailedPrecondition, RuntimeError):
    """A call on a client that was closed (``Client.close``), or on a forked child's copy of
    its parent's client (reason ``CLIENT_FORKED``): make a new ``Client``. Also a
    ``RuntimeError``, as the client raised before it had this class."""

    def __init__(self, message: str, *, reason: str = "CLIENT_CLOSED") -> None:
        super().__init__(message, reason=reason)


class Aborted(AccyError):
    """A call aborted by a conflict; retrying may succeed."""

    code = grpc.StatusCode.ABORTED


class OutOfRange(AccyError):
    """An offset or size past the end of a buffer."""

    code = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(AccyError):
    """A method or feature this daemon does not have."""

    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(AccyError):
    """A bug in the daemon."""

    code = grpc.StatusCode.INTERNAL


class Unavailable(AccyError):
    """The daemon cannot serve now: draining, restarting, or its device was lost.

    With ``reason == "DEVICE_LOST"``, ``session`` names the session whose work
    faulted, where the daemon knows it.
    """

    code = grpc.StatusCode.UNAVAILABLE

    @property
    def session(self) -> str | None:
        return self.metadata.get("session") or self.metadata.get("session_id")


class DaemonUnreachable(Unavailable):
    """No daemon answered at ``target``: not running, wrong address, or no permission."""

    def __init__(
        self, target: str, detail: str, hint: str | None = None, *, message: str | None = None
    ) -> None:
        advice = (
            "start one with `accyd serve`, or give the address of a running one (the target, "
            "or ACCY_TARGET)" + (f"; {hint}" if hint else "")
        )
        if message is None:
            message = f"no accy daemon answered at {target} ({detail}); {advice}"
        super().__init__(message, reason="UNREACHABLE")
        self.hint = advice if message.endswith(advice) else ""
        self.target = target
        self.detail = detail


class CertificateNotVerified(DaemonUnreachable):
    """The daemon at ``target`` answered, but its TLS certificate did not verify."""

    def __init__(self, target: str, detail: str) -> None:
        advice = (
            "give the CA that signed the daemon's certificate, and the name the certificate "
            "carries where it is not the target's host"
        )
        super().__init__(
            target,
            detail,
            message=f"the TLS certificate of the daemon at {target} did not verify against the "
            f"CA given ({detail}); {advice}",
        )
        self.hint = advice


class CertificateNameMismatch(CertificateNotVerified):
    """The daemon's TLS certificate verified, but carries another name than the one dialled."""

    def __init__(self, target: str, detail: str) -> None:
        super().__init__(target, detail)
        self.hint = (
            "dial a name the daemon's certificate carries (its subjectAltName), or give that "
            "name as the TLS server name"
        )
        self.message = (
            f"the TLS certificate of the daemon at {target} is not for the name dialled "
            f"({detail}); {self.hint}"
        )
        self.args = (self.message,)


class DaemonWithoutTls(DaemonUnreachable):
    """The daemon at ``target`` answered in plain text to a TLS handshake."""

    def __init__(self, target: str, detail: str) -> None:
        advice = "connect without TLS, or serve TLS (accyd serve --tls-cert, --tls-key)"
        super().__init__(
            target,
            detail,
            message=f"the daemon at {target} does not serve TLS ({detail}); {advice}",
        )
        self.hint = advice


class ClientCertificateRefused(DaemonUnreachable):
    """The daemon at ``target`` ended the TLS handshake: mutual TLS, without a client
    certificate its client CA signed (gRPC tells the client no more than that)."""

    def __init__(self, target: str, detail: str) -> None:
        advice = "give a client certificate that its client CA signed, and its key"
        super().__init__(
            target,
            detail,
            message=f"the daemon at {target} ended the TLS handshake ({detail}): it serves "
            f"mutual TLS and took no client certificate of this client; {advice}",
        )
        self.hint = advice


class DataLoss(AccyError):
    """Data that was lost, for example buffers of a daemon that restarted."""

    code = grpc.StatusCode.DATA_LOSS


class BufferLost(DataLoss):
    """A buffer whose data is gone: the daemon restarted (or dropped this client) since it was made.

    Nothing was read or written; make the buffer again and write its data.
    ``session`` names the session whose launch faulted, where a device fault
    was the cause.
    """

    def __init__(self, buffer_id: str, why: str, *, session: str | None = None) -> None:
        super().__init__(
            f"buffer {buffer_id} was lost when {why}; write it again",
            reason="BUFFER_LOST",
            metadata={"buffer_id": buffer_id, **({"session": session} if session else {})},
        )
        self.buffer_id = buffer_id
        self.session = session


class SessionLost(DataLoss):
    """A session the client could not load again on the daemon that replaced the old one."""

    def __init__(self, session_id: str, target: str, why: str, cause: AccyError) -> None:
        super().__init__(
            f"session {session_id} ({target}) could not be loaded again after {why}: {cause}",
            reason="SESSION_LOST",
            metadata={"session": session_id},
        )
        self.cause = cause


class Unauthenticated(AccyError):
    """A call without valid credentials."""

    code = grpc.StatusCode.UNAUTHENTICATED


_BY_CODE: dict[grpc.StatusCode, type[AccyError]] = {
    cls.code: cls
    for cls in (
        Cancelled,
        Unknown,
        InvalidArgument,
        DeadlineExceeded,
        NotFound,
        AlreadyExists,
        PermissionDenied,
        ResourceExhausted,
        FailedPrecondition,
        Aborted,
        OutOfRange,
        Unimplemented,
        Internal,
        Unavailable,
        DataLoss,
        Unauthenticated,
    )
}


def error_class(code: grpc.StatusCode) -> type[AccyError]:
    """The exception class for one status code (``Unknown`` for codes without one)."""
    return _BY_CODE.get(code, Unknown)


def from_status(code: grpc.StatusCode, message: str, status: RpcStatus | None) -> AccyError:
    """Build the typed exception for ``code`` from a decoded ``google.rpc.Status``."""
    reason: str | None = None
    domain: str | None = None
    metadata: dict[str, str] = {}
    fields: list[FieldViolation] = []
    quotas: list[QuotaViolation] = []
    request_id: str | None = None
    for detail in status.details if status is not None else ():
        info, bad, quota, request = ErrorInfo(), BadRequest(), QuotaFailure(), RequestInfo()
        if detail.Unpack(info):
            reason, domain = info.reason or None, info.domain or None
            metadata.update(info.metadata)
        elif detail.Unpack(bad):
            fields.extend(FieldViolation(v.field, v.description) for v in bad.field_violations)
        elif detail.Unpack(quota):
            quotas.extend(QuotaViolation(v.subject, v.description) for v in quota.violations)
        elif detail.Unpack(request):
            request_id = request.request_id or None
    return error_class(code)(
        message,
        reason=reason,
        domain=domain,
        metadata=metadata,
        field_violations=fields,
        quota_violations=quotas,
        request_id=request_id,
    )


_CODE_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


def from_rpc_status(status: RpcStatus) -> AccyError:
    """The typed exception of a ``google.rpc.Status`` sent as data, not as a call's status."""
    code = _CODE_BY_NUMBER.get(status.code, grpc.StatusCode.UNKNOWN)
    return from_status(code, status.message or code.name, status)


def with_hint(error: AccyError, hint: str) -> AccyError:
    """``error`` with ``hint`` (what to do about it) added to its message; returns it."""
    error.message = f"{error.message}; {hint}"
    error.args = (error.message,)
    error.hint = f"{error.hint}; {hint}" if error.hint else hint
    return error


def from_rpc_error(error: grpc.RpcError) -> AccyError:
    """Turn a failed gRPC call into the typed exception for its status and details (a
    blocking call's, or a ``grpc.aio`` one's: its error carries the same status)."""
    if not isinstance(error, grpc.Call | grpc.aio.AioRpcError):
        return Unknown(str(error) or type(error).__name__)
    code = error.code()
    message = error.details() or code.name
    try:
        # an AioRpcError has the code(), details() and trailing_metadata() it reads
        status = rpc_status.from_call(cast(grpc.Call, error))
    except ValueError:  # details that disagree with the status line: keep the line
        status = None
    return from_status(code, message, status)
