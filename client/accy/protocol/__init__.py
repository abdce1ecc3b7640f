"""The accy wire protocol: generated messages and every constant both daemon and client rely on.

Both sides import these from here and nowhere else: the metadata keys each call
carries, the ``ErrorInfo`` domain and reasons the daemon sends, where the
default socket lives (and which folders may hold it), and the element types.
Importing this package loads neither the client nor gRPC; the generated
service stubs are in ``accy.protocol.launch.v1``.
"""

from __future__ import annotations

from accy.protocol.dtypes import DTYPES, WireDType, dtype_named, dtype_of_numpy, dtype_of_wire
from accy.protocol.sockets import (
    SOCKET_NAME,
    TARGET_ENV,
    UnsafeSocketFolder,
    check_socket_folder,
    default_socket_path,
    default_target,
    is_default_socket,
    prepare_socket_folder,
)

__all__ = [
    "AUTHORIZATION_METADATA",
    "CLIENT_ID_METADATA",
    "CLIENT_UNKNOWN",
    "DEVICE_LOST",
    "DEVICE_SCOPE",
    "DTYPES",
    "ERROR_DOMAIN",
    "SOCKET_NAME",
    "TARGET_ENV",
    "UnsafeSocketFolder",
    "WireDType",
    "check_socket_folder",
    "default_socket_path",
    "default_target",
    "dtype_named",
    "dtype_of_numpy",
    "dtype_of_wire",
    "is_default_socket",
    "prepare_socket_folder",
]

# -- metadata keys ------------------------------------------------------------------------

CLIENT_ID_METADATA = "accy-client-id"
"""The metadata key that names the attached client on every call after Attach."""
AUTHORIZATION_METADATA = "authorization"
"""The metadata key of the bearer token: ``authorization: Bearer <token>``."""

# -- errors -------------------------------------------------------------------------------

ERROR_DOMAIN = "accy.dev"
"""The ``google.rpc.ErrorInfo.domain`` of every error the daemon sends."""

DEVICE_LOST = "DEVICE_LOST"
"""``ErrorInfo.reason``: the daemon's device faulted; it is about to restart.

Its ``metadata["session"]`` names the session whose work faulted, where known, and
``metadata["device"]`` the device. With ``metadata["scope"] == DEVICE_SCOPE`` only that
device was lost: the daemon and every other device live on, the device is replaced at
once, sessions on it must be loaded again and its buffers are gone."""
DEVICE_SCOPE = "device"
"""``metadata["scope"]`` of a ``DEVICE_LOST`` that took one device, not the daemon."""
CLIENT_UNKNOWN = "CLIENT_UNKNOWN"
"""``ErrorInfo.reason`` of ``NOT_FOUND``: the daemon does not know the calling client id
(it restarted, or it detached that client). The call did nothing; attach again."""
