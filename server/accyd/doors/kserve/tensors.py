"""An inference request checked and turned into domain values, before anything is allocated.

Every input is matched to an operand by name, with its datatype, its shape (no
negative dims; the element count is what the pipeline's extents need) and one
source of bytes: raw contents (one entry per input that has neither typed
contents nor a shared-memory region, in order), typed contents, or a region.
A declared shape must agree with the bytes given, so a huge shape is refused
here rather than allocated. Runtime scalars come from the request's
parameters by name; one left out that is an operand's extent alone is that
input's element count. Requested outputs are results, each at most once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from accyd.catalog.dtypes import DType, Scalar
from accyd.catalog.expr import Const, extent_of
from accyd.catalog.model import BufferSpec
from accyd.clipping import clip
from accyd.doors.kserve.models import Model, datatype_of, dtype_of
from accyd.doors.kserve.protocol import open_inference_pb2 as pb
from accyd.errors import AccyError, InvalidRequest, LaunchArgumentMismatch

__all__ = [
    "MAX_DIMS",
    "REGION",
    "RESERVED_PARAMETERS",
    "Checked",
    "Input",
    "Output",
    "RegionSlice",
    "check_request",
    "parameter_value",
]

REGION = "shared_memory_region"
_OFFSET = "shared_memory_offset"
_SIZE = "shared_memory_byte_size"
RESERVED_PARAMETERS = frozenset(
    {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output"}
)
"""Request parameters the protocol's clients may send that are no runtime scalar: ignored."""
RESERVED_PREFIX = "triton_"
"""So are those named so (perf_analyzer sends ``triton_enable_empty_final_response``)."""
MAX_TENSOR_BYTES = 1 << 40
"""No tensor is larger, whatever its shape says (the daemon's largest buffer)."""
MAX_DIMS = 64
"""The most dims a shape may have (Triton's practical bound too): checked before the dims
are multiplied out, so a shape of many dims costs the event loop nothing."""

_CONTENTS = {
    DType.F32: "fp32_contents",
    DType.F64: "fp64_contents",
    DType.I32: "int_contents",
    DType.U32: "uint_contents",
    DType.I64: "int64_contents",
    DType.U64: "uint64_contents",
    DType.U8: "uint_contents",
    DType.I8: "int_contents",
    DType.I16: "int_contents",
    DType.U16: "uint_contents",
    DType.BOOL: "bool_contents",
}
"""The typed-contents list that carries each element type (none carries FP16, BF16 or fp8:
their values come as raw bytes)."""


@dataclass(frozen=True, slots=True)
class RegionSlice:
    """Where in a registered region a tensor lies."""

    region: str
    offset: int
    byte_size: int


@dataclass(frozen=True, slots=True)
class Input:
    spec: BufferSpec
    shape: tuple[int, ...]
    byte_size: int
    data: bytes | None
    """The bytes, unless they come from ``region``."""
    region: RegionSlice | None


@dataclass(frozen=True, slots=True)
class Output:
    index: int
    """Which result."""
    spec: BufferSpec
    shape: tuple[int, ...]
    byte_size: int
    region: RegionSlice | None


@dataclass(frozen=True, slots=True)
class Checked:
    """A request ready to run: inputs in operand order, outputs in answer order."""

    model: Model
    inputs: tuple[Input, ...]
    outputs: tuple[Output, ...]
    scalars: Mapping[str, Scalar]
    args: tuple[Scalar, ...]
    result_sizes: tuple[int, ...]
    """Every result's byte size (the pipeline writes them all, asked for or not)."""
    lowered: int = 0
    """Stream priority levels below its tenant's, from its ``priority`` parameter."""

    @property
    def uses_regions(self) -> bool:
        """Whether an input or output lies in shared memory."""
        return any(i.region is not None for i in self.inputs) or any(
            o.region is not None for o in self.outputs
        )


def check_request(model: Model, request: pb.ModelInferRequest, max_message_bytes: int) -> Checked:
    """Check ``request`` against ``model``; ``AccyError`` naming the field at fault."""
    pipeline = model.pipeline
    given = _inputs_by_operand(model, request)
    raw = list(request.raw_input_contents)
    # Raw contents come in the order of the request's inputs (those without contents or a
    # region), whatever order the inputs name the model's operands in.
    raw_at: dict[int, int] = {}
    for position, tensor in enumerate(request.inputs):
        if REGION not in tensor.parameters and not tensor.HasField("contents"):
            raw_at[position] = len(raw_at)
    inputs: list[Input | None] = [None] * len(pipeline.operands)
    taken = 0
    for index, (spec, (position, tensor)) in enumerate(zip(pipeline.operands, given, strict=True)):
        field = f"inputs[{position}]"
        if tensor.datatype != datatype_of(spec.dtype):
            dtype_of(tensor.datatype, f"{field}.datatype")  # names what is served
            raise InvalidRequest(
                f"input {spec.name!r} is {datatype_of(spec.dtype)}, not {clip(tensor.datatype)}",
                field=f"{field}.datatype",
            )
        shape, byte_size = _byte_size(spec, tensor.shape, f"{field}.shape")
        region = _region(tensor.parameters, field)
        data: bytes | None = None
        if region is not None:
            if region.byte_size != byte_size:
                raise InvalidRequest(
                    f"input {spec.name!r} of shape {list(shape)} is {byte_size} bytes; its "
                    f"{_SIZE} is {region.byte_size}",
                    field=f"{field}.parameters.{_SIZE}",
                )
        elif tensor.HasField("contents"):
            data = _typed(spec, tensor.contents, byte_size, field)
        else:
            at = raw_at[position]
            if at >= len(raw):
                raise InvalidRequest(
                    f"input {spec.name!r} has no data: no raw_input_contents entry, contents "
                    f"or {REGION}",
                    field="raw_input_contents",
                )
            data = raw[at]
            taken += 1
            if len(data) != byte_size:
                raise InvalidRequest(
                    f"input {spec.name!r} of shape {list(shape)} is {byte_size} bytes; its "
                    f"raw_input_contents entry has {len(data)}",
                    field=f"raw_input_contents[{at}]",
                )
        inputs[index] = Input(spec, shape, byte_size, data, region)
    if taken != len(raw):
        raise InvalidRequest(
            f"{len(raw)} raw_input_contents entries for {taken} inputs that take raw contents",
            field="raw_input_contents",
        )
    ready = tuple(i for i in inputs if i is not None)
    args = _scalars(model, request.parameters, ready)
    scalars = {spec.name: arg for spec, arg in zip(pipeline.runtime_scalars, args, strict=True)}
    for position, item in enumerate(ready):
        wanted = _extent(item.spec, args)
        count = item.byte_size // item.spec.dtype.itemsize
        if count != wanted:
            names = ", ".join(f"{k} = {v.value}" for k, v in scalars.items())
            raise LaunchArgumentMismatch(
                f"input {item.spec.name!r} has {count} elements; the pipeline takes "
                f"{wanted} ({item.spec.extent} with {names or 'no scalars'})",
                field=f"inputs[{given[position][0]}].shape",
            )
    sizes = tuple(_bytes(spec, args) for spec in pipeline.results)
    outputs = _outputs(model, request, ready, args, sizes)
    inline = sum(o.byte_size for o in outputs if o.region is None)
    if inline > max_message_bytes:
        raise InvalidRequest(
            f"the outputs asked for are {inline} bytes, past the largest message "
            f"({max_message_bytes}); ask for them in shared memory",
            field="outputs",
        )
    return Checked(model, ready, outputs, scalars, args, sizes, _lowered(request.parameters))


MAX_LOWERED = 5
"""Stream priorities run 0 to 5: lowering further changes nothing."""


def _lowered(parameters: Mapping[str, pb.InferParameter]) -> int:
    """Triton's ``priority`` (0: the model's default; 1 the highest, larger lower) as levels
    below the tenant's stream priority: 0 and 1 run at the tenant's, 2 one level below..."""
    if "priority" not in parameters:
        return 0
    value = parameter_value(parameters["priority"], int, "parameters.priority")
    assert isinstance(value, int)
    if value < 0:
        raise InvalidRequest(
            f"priority is 0 (the default) or a level from 1 (highest) down, not {value}",
            field="parameters.priority",
        )
    return min(max(value - 1, 0), MAX_LOWERED)


def _inputs_by_operand(
    model: Model, request: pb.ModelInferRequest
) -> list[tuple[int, pb.ModelInferRequest.InferInputTensor]]:
    """The request's inputs in the pipeline's operand order, each with its position."""
    pipeline = model.pipeline
    names = {spec.name: i for i, spec in enumerate(pipeline.operands)}
    found: dict[int, tuple[int, pb.ModelInferRequest.InferInputTensor]] = {}
    for position, tensor in enumerate(request.inputs):
        index = names.get(tensor.name)
        if index is None:
            raise InvalidRequest(
                f"model {model.name!r} has no input {clip(tensor.name)!r}; its inputs are "
                f"{', '.join(names)}",
                field=f"inputs[{position}].name",
            )
        if index in found:
            raise InvalidRequest(
                f"input {tensor.name!r} is given twice", field=f"inputs[{position}].name"
            )
        found[index] = (position, tensor)
    missing = [spec.name for i, spec in enumerate(pipeline.operands) if i not in found]
    if missing:
        raise InvalidRequest(
            f"model {model.name!r} needs inputs {', '.join(missing)}", field="inputs"
        )
    return [found[i] for i in range(len(pipeline.operands))]


def _byte_size(spec: BufferSpec, dims: Sequence[int], field: str) -> tuple[tuple[int, ...], int]:
    """An input's shape and byte size. The dims are counted, then each is checked, before
    any arithmetic: no shape costs more than ``MAX_DIMS`` products of bounded numbers."""
    if not 1 <= len(dims) <= MAX_DIMS:
        raise InvalidRequest(
            f"input {spec.name!r}: its shape has {len(dims)} dims; a shape has at least 1 "
            f"and at most {MAX_DIMS} dims",
            field=field,
        )
    shape = tuple(dims)
    if any(d < 0 for d in shape):
        raise InvalidRequest(
            f"input {spec.name!r}: shape {list(shape)} has a negative dim", field=field
        )
    size = spec.dtype.itemsize
    for dim in shape:
        size *= dim
        if size > MAX_TENSOR_BYTES:  # past the bound already (a later 0 is refused as well)
            break
    if size == 0 or size > MAX_TENSOR_BYTES:
        said = size if size <= MAX_TENSOR_BYTES else f"more than {MAX_TENSOR_BYTES}"
        raise InvalidRequest(
            f"input {spec.name!r}: shape {list(shape)} is {said} bytes; a tensor is 1 to "
            f"{MAX_TENSOR_BYTES} bytes",
            field=field,
        )
    return shape, size


def _typed(spec: BufferSpec, contents: pb.InferTensorContents, size: int, field: str) -> bytes:
    wanted = _CONTENTS.get(spec.dtype)
    if wanted is None:
        raise InvalidRequest(
            f"input {spec.name!r} is {datatype_of(spec.dtype)}, which no typed contents list "
            f"carries: send its bytes in raw_input_contents (or a {REGION})",
            field=f"{field}.contents",
        )
    values = getattr(contents, wanted)
    count = size // spec.dtype.itemsize
    elsewhere = [f.name for f, _ in contents.ListFields() if f.name != wanted]
    if elsewhere and not values:
        raise InvalidRequest(
            f"input {spec.name!r} is {datatype_of(spec.dtype)}: its {count} values go in "
            f"contents.{wanted}; they came in contents.{elsewhere[0]}",
            field=f"{field}.contents.{elsewhere[0]}",
        )
    if len(values) != count:
        raise InvalidRequest(
            f"input {spec.name!r} needs {count} values in contents.{wanted}; it has {len(values)}",
            field=f"{field}.contents",
        )
    array = np.asarray(values)
    if spec.dtype.is_integer:
        info = np.iinfo(spec.dtype.numpy.name)
        if array.size and (array.min() < info.min or array.max() > info.max):
            raise InvalidRequest(
                f"input {spec.name!r}: a value does not fit {spec.dtype.value}",
                field=f"{field}.contents",
            )
    return array.astype(spec.dtype.numpy).tobytes()


def _region(parameters: Mapping[str, pb.InferParameter], field: str) -> RegionSlice | None:
    if REGION not in parameters:
        return None
    name = parameter_value(parameters[REGION], str, f"{field}.parameters.{REGION}")
    size = (
        parameter_value(parameters[_SIZE], int, f"{field}.parameters.{_SIZE}")
        if (_SIZE in parameters)
        else None
    )
    offset = (
        parameter_value(parameters[_OFFSET], int, f"{field}.parameters.{_OFFSET}")
        if _OFFSET in parameters
        else 0
    )
    assert isinstance(name, str)
    if size is None:
        raise InvalidRequest(f"{REGION} needs {_SIZE} too", field=f"{field}.parameters.{_SIZE}")
    if not isinstance(size, int) or not isinstance(offset, int) or size < 0 or offset < 0:
        raise InvalidRequest(
            f"{_OFFSET} and {_SIZE} must not be negative", field=f"{field}.parameters"
        )
    return RegionSlice(name, offset, size)


def parameter_value(
    parameter: pb.InferParameter, kind: type[int] | type[float] | type[str], field: str
) -> int | float | str | bool:
    """A parameter's value, as the kind asked for where it converts without loss."""
    choice = parameter.WhichOneof("parameter_choice")
    if choice is None:
        raise InvalidRequest(f"{field} has no value", field=field)
    value: int | float | str | bool = getattr(parameter, choice)
    if kind is str:
        if not isinstance(value, str):
            raise InvalidRequest(f"{field} must be a string", field=field)
        return value
    if isinstance(value, str):
        text = value
        try:
            value = int(text) if kind is int else float(text)
        except ValueError:
            wanted = "an integer" if kind is int else "a number"
            raise InvalidRequest(f"{field} is {clip(text)!r}, not {wanted}", field=field) from None
    if isinstance(value, bool):
        value = int(value)
    if kind is int and isinstance(value, float):
        if not value.is_integer():
            raise InvalidRequest(f"{field} is {value!r}, not an integer", field=field)
        value = int(value)
    return value


def _scalars(
    model: Model, parameters: Mapping[str, pb.InferParameter], inputs: tuple[Input, ...]
) -> tuple[Scalar, ...]:
    """The runtime scalars in order: named parameters, else inferred from an input's length."""
    pipeline = model.pipeline
    declared = {spec.name for spec in pipeline.runtime_scalars}
    for name in parameters:
        reserved = name in RESERVED_PARAMETERS or name.startswith(RESERVED_PREFIX)
        if name not in declared and not reserved:
            takes = ", ".join(sorted(declared)) or "none"
            raise InvalidRequest(
                f"model {model.name!r} takes no parameter {clip(name)!r} (its runtime scalars: "
                f"{takes})",
                field=f"parameters.{clip(name)}",
            )
    inferred = model.inferred_from()
    args = []
    for index, spec in enumerate(pipeline.runtime_scalars):
        field = f"parameters.{spec.name}"
        if spec.name in parameters:
            kind = int if spec.dtype.is_integer else float
            value = parameter_value(parameters[spec.name], kind, field)
        elif index in inferred:
            operand, dim = inferred[index]
            item = inputs[operand]
            value = item.byte_size // item.spec.dtype.itemsize if dim is None else 0
            if dim is not None and len(item.shape) == len(item.spec.shape):
                value = item.shape[dim]
        else:
            raise InvalidRequest(
                f"model {model.name!r} needs parameter {spec.name!r} ({spec.dtype.value})",
                field=field,
            )
        try:
            args.append(Scalar(spec.dtype, value))  # type: ignore[arg-type]
        except AccyError as error:
            raise LaunchArgumentMismatch(f"{spec.name}: {error.message}", field=field) from None
    if args:
        pipeline.validate_runtime_scalars(args)
    return tuple(args)


def _extent(spec: BufferSpec, args: tuple[Scalar, ...]) -> int:
    extent = spec.extent
    return extent.value if isinstance(extent, Const) else extent_of(extent, args)


def _bytes(spec: BufferSpec, args: tuple[Scalar, ...]) -> int:
    """A result's byte size (a constant extent needs no scalar arithmetic: the hot path)."""
    extent = spec.extent
    if isinstance(extent, Const) and extent.value:
        return extent.value * spec.dtype.itemsize
    return spec.byte_size(args)


def _outputs(
    model: Model,
    request: pb.ModelInferRequest,
    inputs: tuple[Input, ...],
    args: tuple[Scalar, ...],
    sizes: tuple[int, ...],
) -> tuple[Output, ...]:
    """The outputs to answer with: those asked for, in order, else every result."""
    results = model.pipeline.results
    names = {spec.name: i for i, spec in enumerate(results)}
    asked: list[tuple[int, RegionSlice | None]] = []
    if not request.outputs:
        asked = [(i, None) for i in range(len(results))]
    for position, wanted in enumerate(request.outputs):
        field = f"outputs[{position}]"
        index = names.get(wanted.name)
        if index is None:
            raise InvalidRequest(
                f"model {model.name!r} has no output {clip(wanted.name)!r}; its outputs are "
                f"{', '.join(names)}",
                field=f"{field}.name",
            )
        if any(index == i for i, _ in asked):
            raise InvalidRequest(f"output {wanted.name!r} is asked twice", field=f"{field}.name")
        region = _region(wanted.parameters, field)
        if region is not None and region.byte_size < sizes[index]:
            raise InvalidRequest(
                f"output {wanted.name!r} is {sizes[index]} bytes; its {_SIZE} is only "
                f"{region.byte_size}",
                field=f"{field}.parameters.{_SIZE}",
            )
        asked.append((index, region))
    return tuple(
        Output(i, results[i], _shape(results[i], inputs, args, sizes[i]), sizes[i], region)
        for i, region in asked
    )


def _shape(
    spec: BufferSpec, inputs: tuple[Input, ...], args: tuple[Scalar, ...], size: int
) -> tuple[int, ...]:
    """An output's shape: its declared one, else that of the first input with the same
    extent, else flat."""
    if spec.shape:
        return spec.dims(args)
    for item in inputs:
        if item.spec.extent == spec.extent:
            return item.shape
    return (size // spec.dtype.itemsize,)
