"""Protocol messages to and from domain values, checking every field on the way in."""

from __future__ import annotations

from collections.abc import Mapping

from accy.protocol import DTYPES
from accy.protocol.launch.v1 import launch_pb2 as pb
from accyd.catalog.dtypes import DType, Scalar
from accyd.catalog.expr import render
from accyd.catalog.model import ArtifactFormat, BufferSpec, IntermediateSpec, Pipeline
from accyd.clipping import clip
from accyd.core.interface import DaemonStatus, TenantStatus, Tensor
from accyd.errors import InvalidRequest, LaunchArgumentMismatch

__all__ = [
    "dtype_from_proto",
    "dtype_to_proto",
    "format_from_proto",
    "pipeline_info",
    "scalars_from_proto",
    "status_to_proto",
    "tensor_from_proto",
    "tensor_to_proto",
]

_DTYPES: dict[int, DType] = {int(d.wire): DType(d.name) for d in DTYPES}
_WIRE: dict[DType, pb.DType] = {DType(d.name): d.wire for d in DTYPES}
_SCALAR_KINDS: dict[str, DType] = {d.name: DType(d.name) for d in DTYPES if d.scalar}


def dtype_from_proto(value: int, field: str) -> DType | None:
    """A wire dtype; ``DTYPE_UNSPECIFIED`` is ``None``, an unknown number is refused."""
    if value == pb.DTYPE_UNSPECIFIED:
        return None
    dtype = _DTYPES.get(value)
    if dtype is None:
        raise InvalidRequest(f"unknown dtype {value}", field=field)
    return dtype


def dtype_to_proto(dtype: DType) -> pb.DType:
    return _WIRE[dtype]


def format_from_proto(value: str) -> ArtifactFormat | None:
    if not value:
        return None
    try:
        return ArtifactFormat(value)
    except ValueError:
        names = ", ".join(f.value for f in ArtifactFormat)
        raise InvalidRequest(
            f"unknown format {clip(value)!r}; formats are {names}", field="format"
        ) from None


def scalars_from_proto(
    scalars: Mapping[str, pb.Scalar], field: str = "runtime_scalars"
) -> dict[str, Scalar]:
    """Typed scalars by name; an empty or out-of-range value is refused naming its field."""
    result = {}
    for name, message in scalars.items():
        where = f"{field}.{clip(name)}"
        kind = message.WhichOneof("value")
        if kind is None:
            raise InvalidRequest(f"runtime scalar {clip(name)!r} has no value", field=where)
        try:
            result[name] = Scalar(_SCALAR_KINDS[kind], getattr(message, kind))
        except LaunchArgumentMismatch as error:
            raise LaunchArgumentMismatch(
                f"runtime scalar {clip(name)!r}: {error}", field=where
            ) from None
    return result


def tensor_from_proto(tensor: pb.Tensor, field: str) -> Tensor:
    return Tensor(tensor.name, dtype_from_proto(tensor.dtype, f"{field}.dtype"), tensor.data)


def tensor_to_proto(tensor: Tensor) -> pb.Tensor:
    dtype = pb.DTYPE_UNSPECIFIED if tensor.dtype is None else dtype_to_proto(tensor.dtype)
    return pb.Tensor(name=tensor.name, dtype=dtype, data=tensor.data)


def _buffer_info(spec: BufferSpec | IntermediateSpec, names: tuple[str, ...]) -> pb.BufferInfo:
    shape = spec.shape if isinstance(spec, BufferSpec) else ()
    return pb.BufferInfo(
        name=spec.name,
        dtype=dtype_to_proto(spec.dtype),
        extent=render(spec.extent, names),
        shape=[render(dim, names) for dim in shape],
    )


def pipeline_info(pipeline: Pipeline, formats: tuple[ArtifactFormat, ...]) -> pb.PipelineInfo:
    names = tuple(spec.name for spec in pipeline.runtime_scalars)
    scalars = [
        pb.ScalarInfo(name=s.name, dtype=dtype_to_proto(s.dtype)) for s in pipeline.runtime_scalars
    ]
    for bound in pipeline.runtime_scalar_bounds:
        info = scalars[bound.argument_index]
        info.has_max, info.max = True, float(bound.max_value)
        if bound.min_value is not None:
            info.has_min, info.min = True, float(bound.min_value)
    return pb.PipelineInfo(
        target=pipeline.target,
        version=pipeline.version,
        description=pipeline.description,
        operands=[_buffer_info(spec, names) for spec in pipeline.operands],
        results=[_buffer_info(spec, names) for spec in pipeline.results],
        runtime_scalars=scalars,
        intermediates=[_buffer_info(spec, names) for spec in pipeline.intermediates],
        stage_count=len(pipeline.stages),
        formats=[f.value for f in formats],
    )


def status_to_proto(status: DaemonStatus) -> pb.GetStatusResponse:
    return pb.GetStatusResponse(
        instance_id=status.instance_id,
        backend=status.backend,
        device_name=status.device_name,
        serving=status.serving,
        uptime_seconds=status.uptime_seconds,
        clients=status.clients,
        sessions=status.sessions,
        buffers=status.buffers,
        device_memory_in_use=status.device_memory_in_use,
        launches_total=status.launches_total,
        launches_failed=status.launches_failed,
        my_sessions=status.my_sessions,
        my_buffers=status.my_buffers,
        my_memory_in_use=status.my_memory_in_use,
        tenants=[_tenant_to_proto(tenant) for tenant in status.tenants],
        quota_refusals=status.quota_refusals,
        devices=[
            pb.DeviceStatus(
                index=d.index,
                name=d.name,
                backend=d.backend,
                serving=d.serving,
                clients=d.clients,
                sessions=d.sessions,
                buffers=d.buffers,
                memory_in_use=d.memory_in_use,
                launches_in_flight=d.launches_in_flight,
                replacements=d.replacements,
                isolated=d.isolated,
                partitions=[
                    pb.PartitionStatus(
                        name=p.name, sms=p.sms, sessions=p.sessions, tenants=p.tenants
                    )
                    for p in d.partitions
                ],
                unconfined=d.unconfined,
            )
            for d in status.devices
        ],
    )


def _tenant_to_proto(tenant: TenantStatus) -> pb.TenantStatus:
    quotas, usage = tenant.quotas, tenant.usage
    return pb.TenantStatus(
        name=tenant.name,
        clients=tenant.clients,
        memory_bytes=usage.memory_bytes,
        sessions=usage.sessions,
        buffers=usage.buffers,
        launches_in_flight=usage.launches_in_flight,
        quotas=pb.TenantQuotas(
            memory_bytes=quotas.memory_bytes,
            sessions=quotas.sessions,
            buffers=quotas.buffers,
            launches_in_flight=quotas.launches_in_flight,
        ),
        quota_refusals=tenant.quota_refusals,
        partition=tenant.partition,
        priority=tenant.priority,
    )
