"""The one place the HTTP door's refusals get their HTTP status and JSON body.

Every refusal is first the gRPC status the KServe gRPC door would answer (the
same checks make it, ``accyd.doors.grpc.status`` maps domain errors), then
the HTTP status below and the body ``{"error": "<the same message>"}``, as
Triton's HTTP server and tritonclient.http expect. FAILED_PRECONDITION is 400
(a request that cannot run as the daemon stands, such as a truncated region:
Triton answers 400 for every such refusal); ALREADY_EXISTS and ABORTED are 409.
"""

from __future__ import annotations

import json

import grpc
from aiohttp import web

from accyd.core.ids import new_request_id
from accyd.doors.grpc.calls import log_failure
from accyd.doors.grpc.status import to_rpc_status

__all__ = ["HTTP_STATUS", "Refused", "error_response", "refusal_of"]

HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
"""Each gRPC status code's HTTP status; any other is 500."""
_BY_VALUE = {code.value[0]: code for code in grpc.StatusCode}


class Refused(Exception):
    """A call refused with a gRPC status code and the message its caller sees."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)


def refusal_of(error: BaseException) -> Refused:
    """``error`` as the gRPC door would answer it (a non-domain error says only a request
    id, which the daemon's log has with its trace); logged as that door logs it."""
    if isinstance(error, Refused):
        return error
    request_id = new_request_id()
    if isinstance(error, Exception):
        log_failure("call", error, request_id=request_id)
    status = to_rpc_status(error, request_id)
    return Refused(_BY_VALUE.get(status.code, grpc.StatusCode.INTERNAL), status.message)


def error_response(refused: Refused) -> web.Response:
    """The HTTP answer of a refusal: its status and ``{"error": message}``."""
    status = refused.http_status
    return web.Response(
        status=status,
        body=json.dumps({"error": refused.message}).encode(),
        content_type="application/json",
        headers={"WWW-Authenticate": "Bearer"} if status == 401 else None,
    )
