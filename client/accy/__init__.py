"""accy: the Python client of the accy GPU launch daemon.

The client's names load on first use, so ``accy.protocol`` (which the daemon
imports too) comes without the client or gRPC.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accy._export import ExportedBuffer
    from accy._models import (
        Attachment,
        BufferSpec,
        DeviceStatus,
        PartitionStatus,
        PipelineInfo,
        Reattachment,
        ScalarSpec,
        Status,
        TenantQuotas,
        TenantStatus,
    )
    from accy._monitor import Monitor
    from accy.client import Buffer, Client, Launch, Session, resolve_target
    from accy.errors import AccyError, BufferLost

__all__ = [
    "AccyError",
    "Attachment",
    "Buffer",
    "BufferLost",
    "BufferSpec",
    "Client",
    "DeviceStatus",
    "ExportedBuffer",
    "Launch",
    "Monitor",
    "PartitionStatus",
    "PipelineInfo",
    "Reattachment",
    "ScalarSpec",
    "Session",
    "Status",
    "TenantQuotas",
    "TenantStatus",
    "resolve_target",
]

_HOMES = {
    "AccyError": "accy.errors",
    "BufferLost": "accy.errors",
    "Attachment": "accy._models",
    "BufferSpec": "accy._models",
    "DeviceStatus": "accy._models",
    "PartitionStatus": "accy._models",
    "PipelineInfo": "accy._models",
    "Reattachment": "accy._models",
    "ScalarSpec": "accy._models",
    "Status": "accy._models",
    "TenantQuotas": "accy._models",
    "TenantStatus": "accy._models",
    "Buffer": "accy.client",
    "ExportedBuffer": "accy._export",
    "Monitor": "accy._monitor",
    "Client": "accy.client",
    "Launch": "accy.client",
    "Session": "accy.client",
    "resolve_target": "accy.client",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'accy' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
