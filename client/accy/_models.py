"""Plain descriptions of pipelines and daemon status, read from the protocol messages."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from google.protobuf.message import Message

from accy import _extent
from accy._dtypes import from_wire, name_of
from accy.protocol.launch.v1 import launch_pb2

__all__ = [
    "Attachment",
    "BufferSpec",
    "DeviceStatus",
    "PartitionStatus",
    "PipelineInfo",
    "Reattachment",
    "ScalarSpec",
    "Status",
    "TenantQuotas",
    "TenantStatus",
    "plain",
]


@dataclass(frozen=True, slots=True)
class BufferSpec:
    """An operand, result or intermediate: its name, element type and minimum extent."""

    name: str
    dtype: np.dtype[Any] | None
    extent: str
    shape: tuple[str, ...] = ()
    """The tensor's dims as expressions over the runtime scalars; empty when flat."""

    @classmethod
    def from_proto(cls, info: launch_pb2.BufferInfo) -> BufferSpec:
        return cls(info.name, from_wire(info.dtype), info.extent, tuple(info.shape))

    def elements(self, scalars: Mapping[str, int]) -> int:
        """The fewest elements this buffer must hold for these runtime scalars."""
        return _extent.evaluate(self.extent, scalars)

    def dims(self, scalars: Mapping[str, int]) -> tuple[int, ...]:
        """The tensor's shape for these runtime scalars (``(elements,)`` when flat)."""
        return tuple(_extent.evaluate(dim, scalars) for dim in self.shape or (self.extent,))

    def default_scalars(self, array: np.ndarray[Any, Any], values: dict[str, float]) -> None:
        """Put in ``values`` the scalars this operand's extent or shape names alone, read
        from ``array`` (its length, or its dims), unless they are there already."""
        if self.shape and array.ndim == len(self.shape):
            for dim, size in zip(self.shape, array.shape, strict=True):
                if dim.strip().isidentifier():
                    values.setdefault(dim.strip(), size)
            return
        name = self.extent.strip()
        if name.isidentifier():
            values.setdefault(name, array.size)

    def shaped(
        self, flat: np.ndarray[Any, Any], values: Mapping[str, float]
    ) -> np.ndarray[Any, Any]:
        """A result read flat, in this buffer's shape for the launch's scalars (as it came
        where it has no shape)."""
        if not self.shape:
            return flat
        dims = self.dims({k: int(v) for k, v in values.items() if float(v).is_integer()})
        count = math.prod(dims)
        return flat[:count].reshape(dims)

    def to_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {"name": self.name, "dtype": name_of(self.dtype)}
        found["extent"] = self.extent
        if self.shape:
            found["shape"] = list(self.shape)
        return found


@dataclass(frozen=True, slots=True)
class ScalarSpec:
    """A runtime scalar: name, element type and inclusive bounds where declared."""

    name: str
    dtype: np.dtype[Any]
    min: float | None
    max: float | None

    @classmethod
    def from_proto(cls, info: launch_pb2.ScalarInfo) -> ScalarSpec:
        dtype = from_wire(info.dtype)
        if dtype is None:
            raise ValueError(f"runtime scalar {info.name!r} has no dtype")
        return cls(
            info.name,
            dtype,
            info.min if info.has_min else None,
            info.max if info.has_max else None,
        )

    @property
    def is_integer(self) -> bool:
        return self.dtype.kind in "iu"

    def bounds_text(self) -> str:
        """The bounds as ``accy pipelines`` prints them (``1..1073741824``)."""

        def show(v: float | None) -> str:
            if v is None:
                return ""
            return str(int(v)) if self.is_integer else f"{v:g}"

        if self.min is None and self.max is None:
            return "any"
        return f"{show(self.min)}..{show(self.max)}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: an integer scalar's bounds as integers (the wire carries doubles)."""

        def bound(v: float | None) -> float | None:
            return int(v) if v is not None and self.is_integer else v

        return {
            "name": self.name,
            "dtype": name_of(self.dtype),
            "min": bound(self.min),
            "max": bound(self.max),
        }


@dataclass(frozen=True, slots=True)
class PipelineInfo:
    """Everything a client needs to call one pipeline, as ``ListPipelines`` describes it."""

    target: str
    version: int
    description: str
    operands: tuple[BufferSpec, ...]
    results: tuple[BufferSpec, ...]
    runtime_scalars: tuple[ScalarSpec, ...]
    intermediates: tuple[BufferSpec, ...]
    stage_count: int
    formats: tuple[str, ...]

    @classmethod
    def from_proto(cls, info: launch_pb2.PipelineInfo) -> PipelineInfo:
        return cls(
            target=info.target,
            version=info.version,
            description=info.description,
            operands=tuple(BufferSpec.from_proto(b) for b in info.operands),
            results=tuple(BufferSpec.from_proto(b) for b in info.results),
            runtime_scalars=tuple(ScalarSpec.from_proto(s) for s in info.runtime_scalars),
            intermediates=tuple(BufferSpec.from_proto(b) for b in info.intermediates),
            stage_count=info.stage_count,
            formats=tuple(info.formats),
        )

    def scalar(self, name: str) -> ScalarSpec:
        """The declaration of one runtime scalar; ``KeyError`` naming the known ones."""
        for spec in self.runtime_scalars:
            if spec.name == name:
                return spec
        known = ", ".join(s.name for s in self.runtime_scalars) or "none"
        raise KeyError(f"{self.target} has no runtime scalar {name!r} (it takes: {known})")

    def signature(self) -> str:
        """One line: ``x: f32[n] -> y: f32[n]; n: u32 1..1073741824``."""

        def bufs(specs: tuple[BufferSpec, ...]) -> str:
            return ", ".join(f"{b.name}: {name_of(b.dtype)}[{b.extent}]" for b in specs)

        scalars = ", ".join(
            f"{s.name}: {name_of(s.dtype)} {s.bounds_text()}" for s in self.runtime_scalars
        )
        return f"{bufs(self.operands)} -> {bufs(self.results)}; {scalars}"

    def to_dict(self) -> dict[str, Any]:
        def many(specs: tuple[BufferSpec, ...] | tuple[ScalarSpec, ...]) -> list[dict[str, Any]]:
            return [s.to_dict() for s in specs]

        return {
            "target": self.target,
            "version": self.version,
            "description": self.description,
            "operands": many(self.operands),
            "results": many(self.results),
            "runtime_scalars": many(self.runtime_scalars),
            "intermediates": many(self.intermediates),
            "stage_count": self.stage_count,
            "formats": list(self.formats),
        }


@dataclass(frozen=True, slots=True)
class Attachment:
    """Who this client is to the daemon, from the first event of its Attach stream."""

    client_id: str
    instance_id: str
    backend: str
    device_name: str
    tenant: str

    @classmethod
    def from_proto(cls, attached: launch_pb2.Attached) -> Attachment:
        return cls(
            attached.client_id,
            attached.instance_id,
            attached.backend,
            attached.device_name,
            attached.tenant,
        )


@dataclass(frozen=True, slots=True)
class TenantQuotas:
    """A tenant's limits; ``None``: no limit."""

    memory_bytes: int | None = None
    sessions: int | None = None
    buffers: int | None = None
    launches_in_flight: int | None = None

    @classmethod
    def from_proto(cls, quotas: launch_pb2.TenantQuotas) -> TenantQuotas:
        return cls(**plain(quotas))


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    """One SM partition of a device: its SMs, the tenants placed in it, their sessions there."""

    name: str
    sms: int
    sessions: int
    tenants: tuple[str, ...]

    @classmethod
    def from_proto(cls, partition: launch_pb2.PartitionStatus) -> PartitionStatus:
        return cls(partition.name, partition.sms, partition.sessions, tuple(partition.tenants))


@dataclass(frozen=True, slots=True)
class DeviceStatus:
    """One device of the daemon: what clients hold there, and its replacements after faults."""

    index: int
    name: str
    backend: str
    serving: bool
    clients: int
    sessions: int
    buffers: int
    memory_in_use: int
    launches_in_flight: int
    replacements: int
    """Sticky faults on this device that its worker process was replaced after."""
    isolated: bool
    """Whether it runs in a process of its own (a fault there spares the other devices)."""
    partitions: tuple[PartitionStatus, ...] = ()
    """Its SM partitions (the tokens file's ``[partitions]``), with their use."""
    unconfined: str = ""
    """Why it made none of the partitions asked for (``""``: made, or none asked)."""

    @classmethod
    def from_proto(cls, device: launch_pb2.DeviceStatus) -> DeviceStatus:
        values = {f.name: getattr(device, f.name) for f in dataclasses.fields(cls)}
        values["partitions"] = tuple(PartitionStatus.from_proto(p) for p in device.partitions)
        return cls(**values)


@dataclass(frozen=True, slots=True)
class TenantStatus:
    """One tenant: what it holds now, its quotas, and its refusals by quota name."""

    name: str
    clients: int
    memory_bytes: int
    sessions: int
    buffers: int
    launches_in_flight: int
    quotas: TenantQuotas
    quota_refusals: Mapping[str, int]
    partition: str = ""
    """Its SM partition, ``unconfined: <why>`` where a device did not make it, or ``""``."""
    priority: int = 0
    """Its session streams' priority (0 to 5: higher runs first)."""

    @classmethod
    def from_proto(cls, tenant: launch_pb2.TenantStatus) -> TenantStatus:
        return cls(
            name=tenant.name,
            clients=tenant.clients,
            memory_bytes=tenant.memory_bytes,
            sessions=tenant.sessions,
            buffers=tenant.buffers,
            launches_in_flight=tenant.launches_in_flight,
            quotas=TenantQuotas.from_proto(tenant.quotas),
            quota_refusals=dict(tenant.quota_refusals),
            partition=tenant.partition,
            priority=tenant.priority,
        )


@dataclass(frozen=True, slots=True)
class Status:
    """The daemon's state as this client may see it (``GetStatus``).

    ``tenants`` holds the caller's tenant, or every tenant for a token with the
    admin scope. Fields the daemon sends that this client version does not name
    (a newer daemon's counters) are kept in ``extra``, as plain values.
    """

    instance_id: str
    backend: str
    device_name: str
    serving: bool
    uptime_seconds: float
    clients: int
    sessions: int
    buffers: int
    device_memory_in_use: int
    launches_total: int
    launches_failed: int
    my_sessions: int
    my_buffers: int
    my_memory_in_use: int
    tenant: str = ""
    """The caller's tenant (from its token)."""
    tenants: tuple[TenantStatus, ...] = ()
    quota_refusals: int = 0
    """Calls refused by a quota since this daemon process started, all tenants."""
    restarts: int = 0
    """Times the supervisor restarted the daemon process."""
    device_faults: int = 0
    """Sticky device faults among those restarts (this process's own included), and the
    faults that devices were replaced after."""
    devices: tuple[DeviceStatus, ...] = ()
    """Each device the daemon serves, by index."""
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_proto(cls, response: launch_pb2.GetStatusResponse) -> Status:
        values = plain(response)
        named = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        extra = {k: v for k, v in values.items() if k not in named}
        values["tenants"] = tuple(TenantStatus.from_proto(t) for t in response.tenants)
        values["devices"] = tuple(DeviceStatus.from_proto(d) for d in response.devices)
        return cls(**{k: values[k] for k in named}, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        """Every field the daemon sent, as plain values: the named ones, then ``extra``."""
        named = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"
        }
        named["tenants"] = [dataclasses.asdict(t) for t in self.tenants]
        named["devices"] = [dataclasses.asdict(d) for d in self.devices]
        return {**named, **self.extra}


@dataclass(frozen=True, slots=True)
class Reattachment:
    """One time the client attached again by itself: why, to what, and what it restored or lost."""

    number: int
    """1 for the first reattachment of this client, then 2, ..."""
    previous: Attachment
    attachment: Attachment
    why: str
    """What ended the old attachment: "the daemon lost its device to a fault in session S"."""
    restarted: bool
    """Whether the daemon is a new instance (``instance_id`` changed)."""
    fault_session: str | None
    """The session whose launch faulted the device, where that was the cause."""
    sessions_restored: int
    sessions_lost: int
    buffers_lost: int
    seconds: float
    """From noticing the loss to attached again with every session restored."""


def plain(message: Message) -> dict[str, Any]:
    """Every field of ``message`` (unset ones at their defaults) as plain Python values.

    Messages become dicts, maps dicts, repeated fields lists, enums their names;
    64-bit integers stay integers; an ``optional`` field or oneof member not
    set is ``None``.
    """
    return {
        fd.name: None if _unset(message, fd) else _field(fd, getattr(message, fd.name))
        for fd in message.DESCRIPTOR.fields
    }


def _unset(message: Message, fd: Any) -> bool:
    """Whether ``fd`` tracks presence (``optional``, a oneof member) and is not set."""
    return bool(fd.has_presence and not fd.is_repeated and not message.HasField(fd.name))


def _field(fd: Any, value: Any) -> Any:
    entry = fd.message_type
    if entry is not None and entry.GetOptions().map_entry:
        value_fd = entry.fields_by_name["value"]
        return {str(k): _single(value_fd, v) for k, v in value.items()}
    if fd.is_repeated:
        return [_single(fd, v) for v in value]
    return _single(fd, value)


def _single(fd: Any, value: Any) -> Any:
    if fd.message_type is not None:
        return plain(value)
    if fd.enum_type is not None:
        known = fd.enum_type.values_by_number.get(value)
        return known.name if known is not None else value
    if isinstance(value, bytes):
        return value.hex()
    return value
