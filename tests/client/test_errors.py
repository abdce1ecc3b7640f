"""Decoding of gRPC status and google.rpc details into typed exceptions."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from accy import errors
from accy._failures import CANCELLED_THERE, translate


def _status(code: int, *details: object) -> status_pb2.Status:
    packed = []
    for detail in details:
        message = any_pb2.Any()
        message.Pack(detail)
        packed.append(message)
    return status_pb2.Status(code=code, message="m", details=packed)


def test_every_status_code_has_a_class() -> None:
    for code in grpc.StatusCode:
        if code is grpc.StatusCode.OK:
            continue
        cls = errors.error_class(code)
        assert cls.code is code
        assert issubclass(cls, errors.AccyError)


def test_error_info_bad_request_and_quota_are_decoded() -> None:
    status = _status(
        code_pb2.RESOURCE_EXHAUSTED,
        error_details_pb2.ErrorInfo(
            reason="QUOTA_EXCEEDED", domain="accy.dev", metadata={"k": "v"}
        ),
        error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(
                    field="byte_size", description="too big"
                )
            ]
        ),
        error_details_pb2.QuotaFailure(
            violations=[
                error_details_pb2.QuotaFailure.Violation(subject="sessions", description="8 max")
            ]
        ),
    )
    error = errors.from_status(grpc.StatusCode.RESOURCE_EXHAUSTED, "over", status)
    assert isinstance(error, errors.ResourceExhausted)
    assert (error.reason, error.domain, error.metadata) == (
        "QUOTA_EXCEEDED",
        "accy.dev",
        {"k": "v"},
    )
    assert error.field_violations == (errors.FieldViolation("byte_size", "too big"),)
    assert error.quota == "sessions"
    assert "RESOURCE_EXHAUSTED: over [QUOTA_EXCEEDED]" in str(error)
    assert "byte_size: too big" in str(error)


def test_device_lost_names_the_session() -> None:
    status = _status(
        code_pb2.UNAVAILABLE,
        error_details_pb2.ErrorInfo(
            reason="DEVICE_LOST", domain="accy.dev", metadata={"session": "s1"}
        ),
    )
    error = errors.from_status(grpc.StatusCode.UNAVAILABLE, "lost", status)
    assert isinstance(error, errors.Unavailable)
    assert (error.reason, error.session) == ("DEVICE_LOST", "s1")


def test_no_details_keeps_code_and_message() -> None:
    error = errors.from_status(grpc.StatusCode.NOT_FOUND, "gone", None)
    assert isinstance(error, errors.NotFound)
    assert error.reason is None and error.fields == () and error.message == "gone"


def test_quota_from_metadata_when_no_quota_failure() -> None:
    status = _status(
        code_pb2.RESOURCE_EXHAUSTED,
        error_details_pb2.ErrorInfo(reason="QUOTA_EXCEEDED", metadata={"quota": "buffers"}),
    )
    error = errors.from_status(grpc.StatusCode.RESOURCE_EXHAUSTED, "over", status)
    assert isinstance(error, errors.ResourceExhausted) and error.quota == "buffers"


def test_plain_rpc_error_without_call() -> None:
    assert isinstance(errors.from_rpc_error(grpc.RpcError("odd")), errors.Unknown)


@pytest.mark.parametrize("code", [grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INTERNAL])
def test_unknown_details_are_ignored(code: grpc.StatusCode) -> None:
    status = _status(code.value[0], error_details_pb2.DebugInfo(detail="trace"))
    error = errors.from_status(code, "x", status)
    assert error.code is code and error.reason is None


def test_request_id_and_one_line_field() -> None:
    status = _status(
        code_pb2.INVALID_ARGUMENT,
        error_details_pb2.RequestInfo(request_id="req-9"),
        error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field="n", description="m")
            ]
        ),
    )
    error = errors.from_status(grpc.StatusCode.INVALID_ARGUMENT, "m", status)
    assert error.request_id == "req-9"
    assert str(error) == "INVALID_ARGUMENT: m (field n)"


class _Ended(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    """A call that failed CANCELLED, cancelled here or not."""

    def __init__(self, details: str, here: bool) -> None:
        self._details, self._here = details, here

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.CANCELLED

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[()]:
        return ()

    def initial_metadata(self) -> tuple[()]:
        return ()

    def cancelled(self) -> bool:
        return self._here

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> None:
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: object) -> bool:
        return False


def _translated(details: str, here: bool) -> errors.AccyError:
    return translate(_Ended(details, here), target="unix:/x.sock", secure=False, has_token=False)


def test_a_call_the_daemons_side_cancelled_is_unavailable_not_cancelled() -> None:
    """A call gRPC cancelled as the daemon stopped read as if the user had cancelled it."""
    there = _translated("CANCELLED", here=False)
    assert isinstance(there, errors.Unavailable) and not isinstance(there, errors.Cancelled)
    assert there.reason == CANCELLED_THERE and "retry" in there.message
    assert isinstance(_translated("Locally cancelled by application!", here=True), errors.Cancelled)
