from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    DTYPE_F32: _ClassVar[DType]
    DTYPE_F64: _ClassVar[DType]
    DTYPE_I32: _ClassVar[DType]
    DTYPE_U32: _ClassVar[DType]
    DTYPE_I64: _ClassVar[DType]
    DTYPE_U64: _ClassVar[DType]
    DTYPE_U8: _ClassVar[DType]
    DTYPE_F16: _ClassVar[DType]
    DTYPE_BF16: _ClassVar[DType]
    DTYPE_F8E4M3: _ClassVar[DType]
    DTYPE_F8E5M2: _ClassVar[DType]
    DTYPE_I8: _ClassVar[DType]
    DTYPE_I16: _ClassVar[DType]
    DTYPE_U16: _ClassVar[DType]
    DTYPE_BOOL: _ClassVar[DType]

class CopyDirection(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COPY_DIRECTION_UNSPECIFIED: _ClassVar[CopyDirection]
    COPY_DIRECTION_TO_BUFFER: _ClassVar[CopyDirection]
    COPY_DIRECTION_TO_SEGMENT: _ClassVar[CopyDirection]

class ExportKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXPORT_KIND_UNSPECIFIED: _ClassVar[ExportKind]
    EXPORT_KIND_CUDA_VMM: _ClassVar[ExportKind]
    EXPORT_KIND_HOST_MEMFD: _ClassVar[ExportKind]
DTYPE_UNSPECIFIED: DType
DTYPE_F32: DType
DTYPE_F64: DType
DTYPE_I32: DType
DTYPE_U32: DType
DTYPE_I64: DType
DTYPE_U64: DType
DTYPE_U8: DType
DTYPE_F16: DType
DTYPE_BF16: DType
DTYPE_F8E4M3: DType
DTYPE_F8E5M2: DType
DTYPE_I8: DType
DTYPE_I16: DType
DTYPE_U16: DType
DTYPE_BOOL: DType
COPY_DIRECTION_UNSPECIFIED: CopyDirection
COPY_DIRECTION_TO_BUFFER: CopyDirection
COPY_DIRECTION_TO_SEGMENT: CopyDirection
EXPORT_KIND_UNSPECIFIED: ExportKind
EXPORT_KIND_CUDA_VMM: ExportKind
EXPORT_KIND_HOST_MEMFD: ExportKind

class Scalar(_message.Message):
    __slots__ = ("u32", "i32", "f32", "f64", "u64", "i64", "f16", "i8", "i16", "u16", "u8")
    U32_FIELD_NUMBER: _ClassVar[int]
    I32_FIELD_NUMBER: _ClassVar[int]
    F32_FIELD_NUMBER: _ClassVar[int]
    F64_FIELD_NUMBER: _ClassVar[int]
    U64_FIELD_NUMBER: _ClassVar[int]
    I64_FIELD_NUMBER: _ClassVar[int]
    F16_FIELD_NUMBER: _ClassVar[int]
    I8_FIELD_NUMBER: _ClassVar[int]
    I16_FIELD_NUMBER: _ClassVar[int]
    U16_FIELD_NUMBER: _ClassVar[int]
    U8_FIELD_NUMBER: _ClassVar[int]
    u32: int
    i32: int
    f32: float
    f64: float
    u64: int
    i64: int
    f16: float
    i8: int
    i16: int
    u16: int
    u8: int
    def __init__(self, u32: _Optional[int] = ..., i32: _Optional[int] = ..., f32: _Optional[float] = ..., f64: _Optional[float] = ..., u64: _Optional[int] = ..., i64: _Optional[int] = ..., f16: _Optional[float] = ..., i8: _Optional[int] = ..., i16: _Optional[int] = ..., u16: _Optional[int] = ..., u8: _Optional[int] = ...) -> None: ...

class AttachRequest(_message.Message):
    __slots__ = ("client_name", "liveness_seconds")
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_SECONDS_FIELD_NUMBER: _ClassVar[int]
    client_name: str
    liveness_seconds: int
    def __init__(self, client_name: _Optional[str] = ..., liveness_seconds: _Optional[int] = ...) -> None: ...

class PingRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PingResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AttachEvent(_message.Message):
    __slots__ = ("attached", "heartbeat")
    ATTACHED_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    attached: Attached
    heartbeat: Heartbeat
    def __init__(self, attached: _Optional[_Union[Attached, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ...) -> None: ...

class Attached(_message.Message):
    __slots__ = ("client_id", "instance_id", "backend", "device_name", "tenant")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    DEVICE_NAME_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    instance_id: str
    backend: str
    device_name: str
    tenant: str
    def __init__(self, client_id: _Optional[str] = ..., instance_id: _Optional[str] = ..., backend: _Optional[str] = ..., device_name: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("sequence",)
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    def __init__(self, sequence: _Optional[int] = ...) -> None: ...

class ListPipelinesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReloadCatalogRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReloadCatalogResponse(_message.Message):
    __slots__ = ("added", "replaced", "removed", "generation")
    ADDED_FIELD_NUMBER: _ClassVar[int]
    REPLACED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    added: _containers.RepeatedScalarFieldContainer[str]
    replaced: _containers.RepeatedScalarFieldContainer[str]
    removed: _containers.RepeatedScalarFieldContainer[str]
    generation: int
    def __init__(self, added: _Optional[_Iterable[str]] = ..., replaced: _Optional[_Iterable[str]] = ..., removed: _Optional[_Iterable[str]] = ..., generation: _Optional[int] = ...) -> None: ...

class BufferInfo(_message.Message):
    __slots__ = ("name", "dtype", "extent", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    EXTENT_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DType
    extent: str
    shape: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., extent: _Optional[str] = ..., shape: _Optional[_Iterable[str]] = ...) -> None: ...

class ScalarInfo(_message.Message):
    __slots__ = ("name", "dtype", "has_min", "min", "has_max", "max")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    HAS_MIN_FIELD_NUMBER: _ClassVar[int]
    MIN_FIELD_NUMBER: _ClassVar[int]
    HAS_MAX_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DType
    has_min: bool
    min: float
    has_max: bool
    max: float
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., has_min: _Optional[bool] = ..., min: _Optional[float] = ..., has_max: _Optional[bool] = ..., max: _Optional[float] = ...) -> None: ...

class PipelineInfo(_message.Message):
    __slots__ = ("target", "version", "description", "operands", "results", "runtime_scalars", "intermediates", "stage_count", "formats")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    OPERANDS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_SCALARS_FIELD_NUMBER: _ClassVar[int]
    INTERMEDIATES_FIELD_NUMBER: _ClassVar[int]
    STAGE_COUNT_FIELD_NUMBER: _ClassVar[int]
    FORMATS_FIELD_NUMBER: _ClassVar[int]
    target: str
    version: int
    description: str
    operands: _containers.RepeatedCompositeFieldContainer[BufferInfo]
    results: _containers.RepeatedCompositeFieldContainer[BufferInfo]
    runtime_scalars: _containers.RepeatedCompositeFieldContainer[ScalarInfo]
    intermediates: _containers.RepeatedCompositeFieldContainer[BufferInfo]
    stage_count: int
    formats: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, target: _Optional[str] = ..., version: _Optional[int] = ..., description: _Optional[str] = ..., operands: _Optional[_Iterable[_Union[BufferInfo, _Mapping]]] = ..., results: _Optional[_Iterable[_Union[BufferInfo, _Mapping]]] = ..., runtime_scalars: _Optional[_Iterable[_Union[ScalarInfo, _Mapping]]] = ..., intermediates: _Optional[_Iterable[_Union[BufferInfo, _Mapping]]] = ..., stage_count: _Optional[int] = ..., formats: _Optional[_Iterable[str]] = ...) -> None: ...

class ListPipelinesResponse(_message.Message):
    __slots__ = ("pipelines", "backend_formats")
    PIPELINES_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FORMATS_FIELD_NUMBER: _ClassVar[int]
    pipelines: _containers.RepeatedCompositeFieldContainer[PipelineInfo]
    backend_formats: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, pipelines: _Optional[_Iterable[_Union[PipelineInfo, _Mapping]]] = ..., backend_formats: _Optional[_Iterable[str]] = ...) -> None: ...

class LoadPipelineRequest(_message.Message):
    __slots__ = ("target", "version", "format", "device")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    target: str
    version: int
    format: str
    device: int
    def __init__(self, target: _Optional[str] = ..., version: _Optional[int] = ..., format: _Optional[str] = ..., device: _Optional[int] = ...) -> None: ...

class LoadPipelineResponse(_message.Message):
    __slots__ = ("session_id", "created", "pipeline", "format", "device")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    created: bool
    pipeline: PipelineInfo
    format: str
    device: int
    def __init__(self, session_id: _Optional[str] = ..., created: _Optional[bool] = ..., pipeline: _Optional[_Union[PipelineInfo, _Mapping]] = ..., format: _Optional[str] = ..., device: _Optional[int] = ...) -> None: ...

class AllocateIntermediatesRequest(_message.Message):
    __slots__ = ("session_id", "runtime_scalars")
    class RuntimeScalarsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Scalar
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Scalar, _Mapping]] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_SCALARS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    runtime_scalars: _containers.MessageMap[str, Scalar]
    def __init__(self, session_id: _Optional[str] = ..., runtime_scalars: _Optional[_Mapping[str, Scalar]] = ...) -> None: ...

class AllocateIntermediatesResponse(_message.Message):
    __slots__ = ("byte_size",)
    BYTE_SIZE_FIELD_NUMBER: _ClassVar[int]
    byte_size: int
    def __init__(self, byte_size: _Optional[int] = ...) -> None: ...

class LaunchRequest(_message.Message):
    __slots__ = ("session_id", "operands", "results", "runtime_scalars", "wait")
    class RuntimeScalarsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Scalar
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Scalar, _Mapping]] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    OPERANDS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_SCALARS_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    operands: _containers.RepeatedScalarFieldContainer[str]
    results: _containers.RepeatedScalarFieldContainer[str]
    runtime_scalars: _containers.MessageMap[str, Scalar]
    wait: bool
    def __init__(self, session_id: _Optional[str] = ..., operands: _Optional[_Iterable[str]] = ..., results: _Optional[_Iterable[str]] = ..., runtime_scalars: _Optional[_Mapping[str, Scalar]] = ..., wait: _Optional[bool] = ...) -> None: ...

class LaunchResponse(_message.Message):
    __slots__ = ("launch_id", "completed", "enqueue_seconds", "elapsed_seconds")
    LAUNCH_ID_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    ENQUEUE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    launch_id: str
    completed: bool
    enqueue_seconds: float
    elapsed_seconds: float
    def __init__(self, launch_id: _Optional[str] = ..., completed: _Optional[bool] = ..., enqueue_seconds: _Optional[float] = ..., elapsed_seconds: _Optional[float] = ...) -> None: ...

class WaitLaunchRequest(_message.Message):
    __slots__ = ("session_id", "launch_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    launch_id: str
    def __init__(self, session_id: _Optional[str] = ..., launch_id: _Optional[str] = ...) -> None: ...

class WaitLaunchResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AllocateBufferRequest(_message.Message):
    __slots__ = ("byte_size", "dtype", "device", "exportable")
    BYTE_SIZE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    EXPORTABLE_FIELD_NUMBER: _ClassVar[int]
    byte_size: int
    dtype: DType
    device: int
    exportable: bool
    def __init__(self, byte_size: _Optional[int] = ..., dtype: _Optional[_Union[DType, str]] = ..., device: _Optional[int] = ..., exportable: _Optional[bool] = ...) -> None: ...

class AllocateBufferResponse(_message.Message):
    __slots__ = ("buffer_id", "byte_size", "device")
    BUFFER_ID_FIELD_NUMBER: _ClassVar[int]
    BYTE_SIZE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    buffer_id: str
    byte_size: int
    device: int
    def __init__(self, buffer_id: _Optional[str] = ..., byte_size: _Optional[int] = ..., device: _Optional[int] = ...) -> None: ...

class WriteBufferChunk(_message.Message):
    __slots__ = ("buffer_id", "offset", "data")
    BUFFER_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    buffer_id: str
    offset: int
    data: bytes
    def __init__(self, buffer_id: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class WriteBufferResponse(_message.Message):
    __slots__ = ("bytes_written",)
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    bytes_written: int
    def __init__(self, bytes_written: _Optional[int] = ...) -> None: ...

class ReadBufferRequest(_message.Message):
    __slots__ = ("buffer_id", "offset", "size", "chunk_size")
    BUFFER_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    buffer_id: str
    offset: int
    size: int
    chunk_size: int
    def __init__(self, buffer_id: _Optional[str] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ..., chunk_size: _Optional[int] = ...) -> None: ...

class ReadBufferChunk(_message.Message):
    __slots__ = ("offset", "data")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class FreeBufferRequest(_message.Message):
    __slots__ = ("buffer_id",)
    BUFFER_ID_FIELD_NUMBER: _ClassVar[int]
    buffer_id: str
    def __init__(self, buffer_id: _Optional[str] = ...) -> None: ...

class FreeBufferResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("name", "dtype", "data")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DType
    data: bytes
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., data: _Optional[bytes] = ...) -> None: ...

class RunRequest(_message.Message):
    __slots__ = ("target", "version", "format", "operands", "runtime_scalars")
    class RuntimeScalarsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Scalar
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Scalar, _Mapping]] = ...) -> None: ...
    TARGET_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    OPERANDS_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_SCALARS_FIELD_NUMBER: _ClassVar[int]
    target: str
    version: int
    format: str
    operands: _containers.RepeatedCompositeFieldContainer[Tensor]
    runtime_scalars: _containers.MessageMap[str, Scalar]
    def __init__(self, target: _Optional[str] = ..., version: _Optional[int] = ..., format: _Optional[str] = ..., operands: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., runtime_scalars: _Optional[_Mapping[str, Scalar]] = ...) -> None: ...

class RunResponse(_message.Message):
    __slots__ = ("results", "elapsed_seconds")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[Tensor]
    elapsed_seconds: float
    def __init__(self, results: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., elapsed_seconds: _Optional[float] = ...) -> None: ...

class OpenRingRequest(_message.Message):
    __slots__ = ("slots", "device_waits")
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_WAITS_FIELD_NUMBER: _ClassVar[int]
    slots: int
    device_waits: bool
    def __init__(self, slots: _Optional[int] = ..., device_waits: _Optional[bool] = ...) -> None: ...

class OpenRingResponse(_message.Message):
    __slots__ = ("ring_id", "ticket", "handoff_name", "slots")
    RING_ID_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    HANDOFF_NAME_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    ring_id: str
    ticket: bytes
    handoff_name: str
    slots: int
    def __init__(self, ring_id: _Optional[str] = ..., ticket: _Optional[bytes] = ..., handoff_name: _Optional[str] = ..., slots: _Optional[int] = ...) -> None: ...

class RingFrame(_message.Message):
    __slots__ = ("slots", "first", "records")
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    FIRST_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    slots: int
    first: int
    records: bytes
    def __init__(self, slots: _Optional[int] = ..., first: _Optional[int] = ..., records: _Optional[bytes] = ...) -> None: ...

class RingState(_message.Message):
    __slots__ = ("slots", "tail", "done", "errors", "entries", "first_error")
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    TAIL_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    FIRST_ERROR_FIELD_NUMBER: _ClassVar[int]
    slots: int
    tail: int
    done: int
    errors: int
    entries: bytes
    first_error: int
    def __init__(self, slots: _Optional[int] = ..., tail: _Optional[int] = ..., done: _Optional[int] = ..., errors: _Optional[int] = ..., entries: _Optional[bytes] = ..., first_error: _Optional[int] = ...) -> None: ...

class OpenSegmentRequest(_message.Message):
    __slots__ = ("byte_size", "device")
    BYTE_SIZE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    byte_size: int
    device: int
    def __init__(self, byte_size: _Optional[int] = ..., device: _Optional[int] = ...) -> None: ...

class OpenSegmentResponse(_message.Message):
    __slots__ = ("segment_id", "ticket", "handoff_name", "byte_size")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    HANDOFF_NAME_FIELD_NUMBER: _ClassVar[int]
    BYTE_SIZE_FIELD_NUMBER: _ClassVar[int]
    segment_id: str
    ticket: bytes
    handoff_name: str
    byte_size: int
    def __init__(self, segment_id: _Optional[str] = ..., ticket: _Optional[bytes] = ..., handoff_name: _Optional[str] = ..., byte_size: _Optional[int] = ...) -> None: ...

class CopySegmentRequest(_message.Message):
    __slots__ = ("segment_id", "segment_offset", "buffer_id", "buffer_offset", "size", "direction")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    BUFFER_ID_FIELD_NUMBER: _ClassVar[int]
    BUFFER_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    segment_id: str
    segment_offset: int
    buffer_id: str
    buffer_offset: int
    size: int
    direction: CopyDirection
    def __init__(self, segment_id: _Optional[str] = ..., segment_offset: _Optional[int] = ..., buffer_id: _Optional[str] = ..., buffer_offset: _Optional[int] = ..., size: _Optional[int] = ..., direction: _Optional[_Union[CopyDirection, str]] = ...) -> None: ...

class CopySegmentResponse(_message.Message):
    __slots__ = ("bytes_copied",)
    BYTES_COPIED_FIELD_NUMBER: _ClassVar[int]
    bytes_copied: int
    def __init__(self, bytes_copied: _Optional[int] = ...) -> None: ...

class CloseSegmentRequest(_message.Message):
    __slots__ = ("segment_id",)
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    segment_id: str
    def __init__(self, segment_id: _Optional[str] = ...) -> None: ...

class CloseSegmentResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ExportBufferRequest(_message.Message):
    __slots__ = ("buffer_id",)
    BUFFER_ID_FIELD_NUMBER: _ClassVar[int]
    buffer_id: str
    def __init__(self, buffer_id: _Optional[str] = ...) -> None: ...

class ExportBufferResponse(_message.Message):
    __slots__ = ("export_id", "ticket", "handoff_name", "kind", "mapping_size", "offset", "byte_size", "gpu_uuid", "device")
    EXPORT_ID_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    HANDOFF_NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MAPPING_SIZE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    BYTE_SIZE_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    export_id: str
    ticket: bytes
    handoff_name: str
    kind: ExportKind
    mapping_size: int
    offset: int
    byte_size: int
    gpu_uuid: bytes
    device: int
    def __init__(self, export_id: _Optional[str] = ..., ticket: _Optional[bytes] = ..., handoff_name: _Optional[str] = ..., kind: _Optional[_Union[ExportKind, str]] = ..., mapping_size: _Optional[int] = ..., offset: _Optional[int] = ..., byte_size: _Optional[int] = ..., gpu_uuid: _Optional[bytes] = ..., device: _Optional[int] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("instance_id", "backend", "device_name", "serving", "uptime_seconds", "clients", "sessions", "buffers", "device_memory_in_use", "launches_total", "launches_failed", "my_sessions", "my_buffers", "my_memory_in_use", "tenant", "tenants", "quota_refusals", "restarts", "device_faults", "devices")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    DEVICE_NAME_FIELD_NUMBER: _ClassVar[int]
    SERVING_FIELD_NUMBER: _ClassVar[int]
    UPTIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_MEMORY_IN_USE_FIELD_NUMBER: _ClassVar[int]
    LAUNCHES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    LAUNCHES_FAILED_FIELD_NUMBER: _ClassVar[int]
    MY_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    MY_BUFFERS_FIELD_NUMBER: _ClassVar[int]
    MY_MEMORY_IN_USE_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    QUOTA_REFUSALS_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FAULTS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
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
    tenant: str
    tenants: _containers.RepeatedCompositeFieldContainer[TenantStatus]
    quota_refusals: int
    restarts: int
    device_faults: int
    devices: _containers.RepeatedCompositeFieldContainer[DeviceStatus]
    def __init__(self, instance_id: _Optional[str] = ..., backend: _Optional[str] = ..., device_name: _Optional[str] = ..., serving: _Optional[bool] = ..., uptime_seconds: _Optional[float] = ..., clients: _Optional[int] = ..., sessions: _Optional[int] = ..., buffers: _Optional[int] = ..., device_memory_in_use: _Optional[int] = ..., launches_total: _Optional[int] = ..., launches_failed: _Optional[int] = ..., my_sessions: _Optional[int] = ..., my_buffers: _Optional[int] = ..., my_memory_in_use: _Optional[int] = ..., tenant: _Optional[str] = ..., tenants: _Optional[_Iterable[_Union[TenantStatus, _Mapping]]] = ..., quota_refusals: _Optional[int] = ..., restarts: _Optional[int] = ..., device_faults: _Optional[int] = ..., devices: _Optional[_Iterable[_Union[DeviceStatus, _Mapping]]] = ...) -> None: ...

class DeviceStatus(_message.Message):
    __slots__ = ("index", "name", "backend", "serving", "clients", "sessions", "buffers", "memory_in_use", "launches_in_flight", "replacements", "isolated", "partitions", "unconfined")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    SERVING_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_IN_USE_FIELD_NUMBER: _ClassVar[int]
    LAUNCHES_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    REPLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    ISOLATED_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    UNCONFINED_FIELD_NUMBER: _ClassVar[int]
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
    isolated: bool
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionStatus]
    unconfined: str
    def __init__(self, index: _Optional[int] = ..., name: _Optional[str] = ..., backend: _Optional[str] = ..., serving: _Optional[bool] = ..., clients: _Optional[int] = ..., sessions: _Optional[int] = ..., buffers: _Optional[int] = ..., memory_in_use: _Optional[int] = ..., launches_in_flight: _Optional[int] = ..., replacements: _Optional[int] = ..., isolated: _Optional[bool] = ..., partitions: _Optional[_Iterable[_Union[PartitionStatus, _Mapping]]] = ..., unconfined: _Optional[str] = ...) -> None: ...

class PartitionStatus(_message.Message):
    __slots__ = ("name", "sms", "sessions", "tenants")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SMS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    sms: int
    sessions: int
    tenants: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., sms: _Optional[int] = ..., sessions: _Optional[int] = ..., tenants: _Optional[_Iterable[str]] = ...) -> None: ...

class TenantStatus(_message.Message):
    __slots__ = ("name", "clients", "memory_bytes", "sessions", "buffers", "launches_in_flight", "quotas", "quota_refusals", "partition", "priority")
    class QuotaRefusalsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    LAUNCHES_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    QUOTAS_FIELD_NUMBER: _ClassVar[int]
    QUOTA_REFUSALS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    name: str
    clients: int
    memory_bytes: int
    sessions: int
    buffers: int
    launches_in_flight: int
    quotas: TenantQuotas
    quota_refusals: _containers.ScalarMap[str, int]
    partition: str
    priority: int
    def __init__(self, name: _Optional[str] = ..., clients: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., sessions: _Optional[int] = ..., buffers: _Optional[int] = ..., launches_in_flight: _Optional[int] = ..., quotas: _Optional[_Union[TenantQuotas, _Mapping]] = ..., quota_refusals: _Optional[_Mapping[str, int]] = ..., partition: _Optional[str] = ..., priority: _Optional[int] = ...) -> None: ...

class TenantQuotas(_message.Message):
    __slots__ = ("memory_bytes", "sessions", "buffers", "launches_in_flight")
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    LAUNCHES_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    memory_bytes: int
    sessions: int
    buffers: int
    launches_in_flight: int
    def __init__(self, memory_bytes: _Optional[int] = ..., sessions: _Optional[int] = ..., buffers: _Optional[int] = ..., launches_in_flight: _Optional[int] = ...) -> None: ...
