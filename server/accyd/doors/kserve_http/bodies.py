"""Inference over HTTP: a JSON request (and its binary tensors) to the gRPC door's request,
its answer back to JSON (and binary tensors).

The binary tensor data extension: with the ``Inference-Header-Content-Length``
header the body is that many bytes of JSON, then each input's bytes whose
parameters say ``binary_data_size``, in the order of the inputs. An output is
answered in binary (after the JSON, its size in its ``binary_data_size``
parameter) where its ``binary_data`` parameter says so, or, without one, where
the request's ``binary_data_output`` parameter does. An output written to
shared memory is answered with its name, datatype and shape alone (as Triton does:
perf_analyzer's client takes an output with parameters for a binary one).

Only the JSON is checked here (its structure, each input's values against its
shape and datatype); everything else is the gRPC door's checks
(``accyd.doors.kserve.tensors``), which see the same request a gRPC caller sends.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from accyd.catalog.dtypes import DType
from accyd.clipping import clip
from accyd.doors.kserve.models import Model, dtype_of
from accyd.doors.kserve.protocol import open_inference_pb2 as pb
from accyd.doors.kserve.tensors import REGION
from accyd.errors import InvalidRequest

__all__ = [
    "BINARY_DATA",
    "BINARY_DATA_OUTPUT",
    "BINARY_SIZE",
    "HEADER_LENGTH",
    "HttpInference",
    "answer",
    "parameters_of",
    "parse_request",
]

HEADER_LENGTH = "Inference-Header-Content-Length"
BINARY_SIZE = "binary_data_size"
BINARY_DATA = "binary_data"
BINARY_DATA_OUTPUT = "binary_data_output"
_INT64 = 1 << 63


@dataclass
class HttpInference:
    """A request as the gRPC door takes it, with what its HTTP answer needs."""

    request: pb.ModelInferRequest
    binary: dict[str, bool] = field(default_factory=dict)
    """Outputs asked for by name: whether each is answered in binary."""
    regions: set[str] = field(default_factory=set)
    """Outputs written to shared memory."""
    binary_default: bool = False
    """The request's ``binary_data_output``."""


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidRequest(f"{where} must be a JSON object", field=where)
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidRequest(f"{where} must be a JSON array", field=where)
    return value


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"{where} must be a string", field=where)
    return value


def parameters_of(raw: Any, where: str) -> dict[str, pb.InferParameter]:
    """JSON parameters as protocol parameters: a bool, an integer, a number or a string each."""
    out: dict[str, pb.InferParameter] = {}
    for name, value in _object(raw, where).items():
        parameter = pb.InferParameter()
        if isinstance(value, bool):
            parameter.bool_param = value
        elif isinstance(value, int) and -_INT64 <= value < _INT64:
            parameter.int64_param = value
        elif isinstance(value, int) and 0 <= value < 1 << 64:
            parameter.uint64_param = value
        elif isinstance(value, float):
            parameter.double_param = value
        elif isinstance(value, str):
            parameter.string_param = value
        else:
            raise InvalidRequest(
                f"parameter {clip(name)!r} must be a bool, an integer, a number or a string",
                field=f"{where}.{clip(name)}",
            )
        out[name] = parameter
    return out


def parse_request(
    header: bytes, binary: memoryview, name: str, version: str, model: Model | None
) -> HttpInference:
    """The request of ``header`` (JSON) and ``binary`` (the bytes after it).

    ``model``, where it is known, puts the inputs in its operand order, the
    order the gRPC door takes raw contents in."""
    try:
        body = json.loads(header)
    except json.JSONDecodeError as error:
        raise InvalidRequest(
            f"the request's JSON header is not JSON: {error.msg} at line {error.lineno} "
            f"column {error.colno}",
            field="body",
        ) from None
    except (ValueError, UnicodeDecodeError):
        raise InvalidRequest("the request's JSON header is not UTF-8 JSON", field="body") from None
    except RecursionError:
        raise InvalidRequest("the request's JSON header nests too deep", field="body") from None
    body = _object(body, "the request")
    request = pb.ModelInferRequest(model_name=name, model_version=version)
    request.id = _text(body.get("id", ""), "id")
    for key, parameter in parameters_of(body.get("parameters", {}), "parameters").items():
        request.parameters[key].CopyFrom(parameter)
    wanted = request.parameters.get(BINARY_DATA_OUTPUT)
    inference = HttpInference(request, binary_default=bool(wanted and wanted.bool_param))
    tensors = [
        _object(item, f"inputs[{i}]") for i, item in enumerate(_list(body.get("inputs"), "inputs"))
    ]
    data = _input_bytes(tensors, binary)
    order = {} if model is None else {s.name: i for i, s in enumerate(model.pipeline.operands)}
    ranked = sorted(
        range(len(tensors)), key=lambda i: order.get(str(tensors[i].get("name")), len(order))
    )
    for position in ranked:
        _add_input(request, tensors[position], data[position], f"inputs[{position}]")
    for position, item in enumerate(_list(body.get("outputs", []), "outputs")):
        where = f"outputs[{position}]"
        item = _object(item, where)
        output = request.outputs.add(name=_text(item.get("name"), f"{where}.name"))
        given = _object(item.get("parameters", {}), f"{where}.parameters")
        binary_data = given.get(BINARY_DATA)
        if binary_data is not None and not isinstance(binary_data, bool):
            raise InvalidRequest(f"{BINARY_DATA} must be true or false", field=where)
        inference.binary[output.name] = (
            inference.binary_default if binary_data is None else binary_data
        )
        if REGION in given:
            inference.regions.add(output.name)
        rest = {k: v for k, v in given.items() if k != BINARY_DATA}
        for key, parameter in parameters_of(rest, f"{where}.parameters").items():
            output.parameters[key].CopyFrom(parameter)
    return inference


def _input_bytes(tensors: Sequence[dict[str, Any]], binary: memoryview) -> list[bytes | None]:
    """Each input's binary bytes (``None`` for one without ``binary_data_size``), taken from
    ``binary`` in order; every byte of it must be taken."""
    out: list[bytes | None] = []
    taken = 0
    for position, tensor in enumerate(tensors):
        parameters = _object(tensor.get("parameters", {}), f"inputs[{position}].parameters")
        size = parameters.get(BINARY_SIZE)
        if size is None:
            out.append(None)
            continue
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise InvalidRequest(
                f"{BINARY_SIZE} must be a byte count",
                field=f"inputs[{position}].parameters.{BINARY_SIZE}",
            )
        if taken + size > len(binary):
            raise InvalidRequest(
                f"input {clip(str(tensor.get('name')))!r} takes bytes {taken}..{taken + size} "
                f"of the binary data after the JSON header; there are {len(binary)}",
                field=f"inputs[{position}].parameters.{BINARY_SIZE}",
            )
        out.append(bytes(binary[taken : taken + size]))
        taken += size
    if taken != len(binary):
        raise InvalidRequest(
            f"{len(binary)} bytes follow the JSON header; the inputs' {BINARY_SIZE} take {taken}",
            field=HEADER_LENGTH,
        )
    return out


def _add_input(
    request: pb.ModelInferRequest, tensor: dict[str, Any], data: bytes | None, where: str
) -> None:
    name = _text(tensor.get("name"), f"{where}.name")
    datatype = _text(tensor.get("datatype"), f"{where}.datatype")
    shape = _list(tensor.get("shape"), f"{where}.shape")
    if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < _INT64 for d in shape):
        raise InvalidRequest(f"{where}.shape must be non-negative integers", field=f"{where}.shape")
    item = request.inputs.add(name=name, datatype=datatype, shape=shape)
    rest = {k: v for k, v in tensor.get("parameters", {}).items() if k != BINARY_SIZE}
    for key, parameter in parameters_of(rest, f"{where}.parameters").items():
        item.parameters[key].CopyFrom(parameter)
    values = tensor.get("data")
    sources = [REGION in rest, data is not None, values is not None]
    if sum(sources) > 1:
        raise InvalidRequest(
            f"input {clip(name)!r} gives more than one of data, {BINARY_SIZE} and {REGION}",
            field=where,
        )
    if not any(sources):
        raise InvalidRequest(
            f"input {clip(name)!r} has no data: give data, {BINARY_SIZE} or {REGION}", field=where
        )
    if values is not None:
        dtype = dtype_of(datatype, f"{where}.datatype")
        data = _json_bytes(name, values, dtype, math.prod(shape), f"{where}.data")
    if data is not None:
        request.raw_input_contents.append(data)


def _flat(values: Any) -> list[Any]:
    """Nested lists as one list, row-major (without recursion: any depth JSON parsed)."""
    out: list[Any] = []
    stack = [iter(values if isinstance(values, list) else [values])]
    while stack:
        for value in stack[-1]:
            if isinstance(value, list):
                stack.append(iter(value))
                break
            out.append(value)
        else:
            stack.pop()
    return out


def _json_bytes(name: str, values: Any, dtype: DType, count: int, where: str) -> bytes:
    """An input's JSON values as its bytes: ``count`` of them, each of its type."""
    flat = _flat(values)
    if len(flat) != count:
        raise InvalidRequest(
            f"input {clip(name)!r} needs {count} values in data (its shape); it has {len(flat)}",
            field=where,
        )
    if dtype is DType.BOOL:
        fits = all(isinstance(v, bool) for v in flat)
    elif dtype.is_integer:
        fits = all(isinstance(v, int) and not isinstance(v, bool) for v in flat)
    else:
        fits = all(isinstance(v, int | float) and not isinstance(v, bool) for v in flat)
    if not fits:
        kind = (
            "true or false"
            if dtype is DType.BOOL
            else "an integer"
            if dtype.is_integer
            else "a number"
        )
        raise InvalidRequest(f"input {clip(name)!r}: each value must be {kind}", field=where)
    try:
        return np.asarray(flat, dtype=dtype.numpy).tobytes()
    except (OverflowError, ValueError):
        raise InvalidRequest(
            f"input {clip(name)!r}: a value does not fit {dtype.value}", field=where
        ) from None


def answer(inference: HttpInference, response: pb.ModelInferResponse) -> tuple[bytes, list[bytes]]:
    """The answer's JSON and the binary outputs that follow it, in order."""
    outputs = []
    tail: list[bytes] = []
    for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=True):
        out: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
        }
        if tensor.name in inference.regions:
            pass  # no data and no parameters: perf_analyzer reads parameters as binary
        elif inference.binary.get(tensor.name, inference.binary_default):
            out["parameters"] = {BINARY_SIZE: len(raw)}
            tail.append(raw)
        else:
            out["data"] = _values(raw, dtype_of(tensor.datatype, "outputs.datatype"))
        outputs.append(out)
    body: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
    }
    if response.id:
        body["id"] = response.id
    body["outputs"] = outputs
    return json.dumps(body).encode(), tail


def _values(raw: bytes, dtype: DType) -> list[Any]:
    array = np.frombuffer(raw, dtype=dtype.numpy)
    if dtype is DType.BOOL:
        array = array.astype(bool)
    elif not dtype.is_integer and array.dtype.kind != "f":  # bf16, fp8: numbers as float32
        array = array.astype(np.float32)
    values: list[Any] = array.tolist()
    return values


def response_headers(header: bytes, tail: Sequence[bytes]) -> Mapping[str, str]:
    """The answer's headers: JSON alone, or the binary extension's."""
    if not tail:
        return {"Content-Type": "application/json"}
    return {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(header))}
