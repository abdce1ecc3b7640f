"""The one place domain errors become gRPC status codes with ``google.rpc`` details.

``ErrorInfo`` carries the error's stable ``reason`` (domain ``accy.dev``) and
metadata such as the session or quota; ``BadRequest`` names the field at fault;
``QuotaFailure`` names the quota; ``RequestInfo`` carries the request id. An
error that is no domain error is ``INTERNAL`` and says only the request id.
Messages and fields are bounded (``accyd.clipping``): they may repeat client text.
"""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped, unused-ignore]
from grpc_status import rpc_status

from accy.protocol import CLIENT_UNKNOWN, DEVICE_SCOPE, ERROR_DOMAIN
from accyd.clipping import bounded
from accyd.errors import (
    AccyError,
    AlreadyExists,
    DeviceFault,
    FailedPrecondition,
    InvalidArtifact,
    InvalidRequest,
    LaunchArgumentMismatch,
    LaunchFailed,
    NotFound,
    OutOfMemory,
    PermissionDenied,
    QuotaExceeded,
    RuntimeUnavailable,
    Unauthenticated,
    Unavailable,
    UnsupportedOperation,
)

__all__ = ["DOMAIN", "code_of", "reason_of", "refusal_fields", "to_rpc_status", "to_status"]

DOMAIN = ERROR_DOMAIN

_CODES: tuple[tuple[type[AccyError], grpc.StatusCode], ...] = (
    (DeviceFault, grpc.StatusCode.UNAVAILABLE),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
    (RuntimeUnavailable, grpc.StatusCode.UNAVAILABLE),
    (QuotaExceeded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (OutOfMemory, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (InvalidArtifact, grpc.StatusCode.INVALID_ARGUMENT),
    (LaunchArgumentMismatch, grpc.StatusCode.INVALID_ARGUMENT),
    (InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (LaunchFailed, grpc.StatusCode.INTERNAL),
)


def code_of(error: AccyError) -> grpc.StatusCode:
    """The status code of a domain error (an unsupported request field is INVALID_ARGUMENT)."""
    if isinstance(error, UnsupportedOperation):
        return grpc.StatusCode.INVALID_ARGUMENT if error.field else grpc.StatusCode.UNIMPLEMENTED
    for kind, code in _CODES:
        if isinstance(error, kind):
            return code
    return grpc.StatusCode.INTERNAL


def refusal_fields(error: AccyError) -> dict[str, object]:
    """What a log line says about a refused call: its code, reason, field and message."""
    return {
        "code": code_of(error).name,
        "reason": reason_of(error),
        "field": None if error.field is None else bounded(error.field),
        "error": bounded(error.message),
    }


def _pack(message: Message) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def reason_of(error: AccyError) -> str:
    """The ``ErrorInfo.reason`` of a domain error: its class's, except that an unknown
    client id is ``CLIENT_UNKNOWN``, on which clients attach again."""
    if isinstance(error, NotFound) and error.field == "client_id":
        return CLIENT_UNKNOWN
    return error.reason


def _details(error: AccyError, message: str, request_id: str) -> list[Message]:
    metadata = {"request_id": request_id}
    field = bounded(error.field) if error.field else None
    if field:
        metadata["field"] = field
    if isinstance(error, DeviceFault):
        if error.session:
            metadata["session"] = error.session
        if error.device is not None:
            metadata["device"] = str(error.device)
        if error.isolated:  # the daemon lives on: reload on that device, its buffers are lost
            metadata["scope"] = DEVICE_SCOPE
    if isinstance(error, QuotaExceeded):
        metadata["quota"] = error.quota
    details: list[Message] = [
        error_details_pb2.ErrorInfo(reason=reason_of(error), domain=DOMAIN, metadata=metadata),
        error_details_pb2.RequestInfo(request_id=request_id),
    ]
    if field:
        violation = error_details_pb2.BadRequest.FieldViolation(field=field, description=message)
        details.append(error_details_pb2.BadRequest(field_violations=[violation]))
    if isinstance(error, QuotaExceeded):
        quota = error_details_pb2.QuotaFailure.Violation(subject=error.quota, description=message)
        details.append(error_details_pb2.QuotaFailure(violations=[quota]))
    return details


def to_rpc_status(error: BaseException, request_id: str) -> status_pb2.Status:
    """The ``google.rpc.Status`` of a failure; internals of a non-domain error are not sent."""
    if isinstance(error, AccyError):
        # Messages may echo what a client sent: bounded, so an error never outgrows the
        # metadata limit (the client would get that complaint instead of the error).
        code, message = code_of(error), bounded(error.message)
        details = _details(error, message, request_id)
    else:
        code = grpc.StatusCode.INTERNAL
        message = f"internal error; the daemon's log has it under request {request_id}"
        details = [error_details_pb2.RequestInfo(request_id=request_id)]
    return status_pb2.Status(
        code=code.value[0], message=message, details=[_pack(d) for d in details]
    )


def to_status(error: BaseException, request_id: str) -> grpc.Status:
    """The status to abort a call with (see ``to_rpc_status``)."""
    return rpc_status.to_status(to_rpc_status(error, request_id))
