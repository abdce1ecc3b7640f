"""The domain's error hierarchy: every failure the core, catalog and backends raise.

Nothing here knows gRPC. The service layer maps each class to one status code
in one place (``accyd.doors.grpc.status``); the ``reason`` of each class is the
stable machine-readable string sent to clients in ``google.rpc.ErrorInfo``.
"""

from __future__ import annotations

from accy.protocol import DEVICE_LOST

__all__ = [
    "AccyError",
    "AlreadyExists",
    "CatalogError",
    "DeviceFault",
    "FailedPrecondition",
    "InvalidArtifact",
    "InvalidRequest",
    "LaunchArgumentMismatch",
    "LaunchFailed",
    "NotFound",
    "OutOfMemory",
    "PermissionDenied",
    "QuotaExceeded",
    "RuntimeUnavailable",
    "ShuttingDown",
    "Unauthenticated",
    "Unavailable",
    "UnsupportedOperation",
]


class AccyError(Exception):
    """Base of every domain error.

    ``field`` names the request field at fault, where one is; the service
    layer turns it into a ``google.rpc.BadRequest`` field violation.
    """

    reason = "ACCY_ERROR"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def __str__(self) -> str:
        return self.message


class InvalidArtifact(AccyError):
    """A pipeline or registry entry that cannot run: unresolvable stage, bad extent."""

    reason = "INVALID_ARTIFACT"


class CatalogError(InvalidArtifact):
    """A catalog manifest that does not load; the message names file, entry and field."""

    reason = "CATALOG_INVALID"


class InvalidRequest(AccyError):
    """A malformed or out-of-range request field: an empty id, a zero size, a bad offset."""

    reason = "INVALID_REQUEST"


class LaunchArgumentMismatch(AccyError):
    """Launch arguments that do not fit the pipeline: counts, bounds, sizes, aliasing, pools."""

    reason = "LAUNCH_ARGUMENT_MISMATCH"


class UnsupportedOperation(AccyError):
    """Something this backend or catalog cannot do, such as a format it does not load."""

    reason = "UNSUPPORTED"


class OutOfMemory(AccyError):
    """An allocation the device (or host) could not satisfy. Fails one call only."""

    reason = "OUT_OF_MEMORY"


class RuntimeUnavailable(AccyError):
    """A driver or runtime call that failed without poisoning the device (load, compile)."""

    reason = "RUNTIME_UNAVAILABLE"


class LaunchFailed(AccyError):
    """A kernel launch or copy that failed without poisoning the device."""

    reason = "LAUNCH_FAILED"


class DeviceFault(AccyError):
    """A sticky device error: the context is poisoned and its process must end.

    ``session`` names the session whose work faulted, where known. ``device``
    is the device's index where known; ``isolated`` says the device runs in a
    worker process of its own, so the daemon lives on: the device is replaced,
    its sessions must be loaded again and its buffers are lost, while every
    other device is untouched.
    """

    reason = DEVICE_LOST

    def __init__(
        self,
        message: str,
        *,
        session: str | None = None,
        field: str | None = None,
        device: int | None = None,
        isolated: bool = False,
    ) -> None:
        super().__init__(message, field=field)
        self.session = session
        self.device = device
        self.isolated = isolated


class NotFound(AccyError):
    """An id or name the caller cannot see: unknown, freed, or another client's."""

    reason = "NOT_FOUND"


class AlreadyExists(AccyError):
    """A name the caller tried to create twice."""

    reason = "ALREADY_EXISTS"


class FailedPrecondition(AccyError):
    """A call that is valid but not in this state (for example scratch too small)."""

    reason = "FAILED_PRECONDITION"


class QuotaExceeded(AccyError):
    """A tenant quota that the call would pass; ``quota`` names which."""

    reason = "QUOTA_EXCEEDED"

    def __init__(self, message: str, *, quota: str, field: str | None = None) -> None:
        super().__init__(message, field=field)
        self.quota = quota


class Unauthenticated(AccyError):
    """A call without valid credentials."""

    reason = "UNAUTHENTICATED"


class PermissionDenied(AccyError):
    """A caller whose credentials lack the scope the call needs."""

    reason = "PERMISSION_DENIED"


class Unavailable(AccyError):
    """The daemon cannot serve now (draining, or the device was lost)."""

    reason = "UNAVAILABLE"


class ShuttingDown(Unavailable):
    """A call the daemon ended because its stop's grace ran out before the call finished."""

    reason = "SHUTTING_DOWN"
