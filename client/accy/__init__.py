"""accy: the Python client of the accy GPU launch daemon."""

from accy._models import (
    Attachment,
    BufferSpec,
    PipelineInfo,
    Reattachment,
    ScalarSpec,
    Status,
)
from accy.client import Buffer, Client, Launch, Session, resolve_target
from accy.errors import AccyError, BufferLost

__all__ = [
    "AccyError",
    "Attachment",
    "Buffer",
    "BufferLost",
    "BufferSpec",
    "Client",
    "Launch",
    "PipelineInfo",
    "Reattachment",
    "ScalarSpec",
    "Session",
    "Status",
    "resolve_target",
]
