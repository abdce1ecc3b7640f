"""accy: the Python client of the accy GPU launch daemon."""

from accy._models import Attachment, BufferSpec, PipelineInfo, ScalarSpec, Status
from accy.client import Buffer, Client, Launch, Session, resolve_target
from accy.errors import AccyError

__all__ = [
    "AccyError",
    "Attachment",
    "Buffer",
    "BufferSpec",
    "Client",
    "Launch",
    "PipelineInfo",
    "ScalarSpec",
    "Session",
    "Status",
    "resolve_target",
]
