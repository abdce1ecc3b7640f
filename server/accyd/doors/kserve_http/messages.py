"""Protocol messages as the JSON of Triton's HTTP server: field names as in the .proto,
every field (defaults too), 64-bit integers as numbers, enums by name, parameters by value.

Triton's HTTP answers write 64-bit counts as JSON numbers (perf_analyzer reads its
statistics with ``GetUint64``), where protobuf's own JSON mapping writes strings.
"""

from __future__ import annotations

import base64
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from accyd.doors.kserve.protocol import open_inference_pb2 as pb

__all__ = ["parameter_json", "to_json"]

_JSON = Any


def parameter_json(parameter: pb.InferParameter) -> _JSON:
    """An ``InferParameter`` as its value alone: ``2``, not ``{"int64_param": 2}``."""
    choice = parameter.WhichOneof("parameter_choice")
    return None if choice is None else getattr(parameter, choice)


def to_json(message: Message) -> dict[str, _JSON]:
    """``message`` as Triton's HTTP server writes it."""
    if isinstance(message, pb.InferParameter):
        raise TypeError("an InferParameter is a value: parameter_json")
    out: dict[str, _JSON] = {}
    fields: Any = message.DESCRIPTOR.fields
    for field in fields:
        if field.containing_oneof is not None and not message.HasField(field.name):
            continue
        value = getattr(message, field.name)
        if _is_map(field):
            entry = field.message_type.fields_by_name["value"]
            out[field.name] = {key: _value(entry, item) for key, item in value.items()}
        elif _repeated(field):
            out[field.name] = [_value(field, item) for item in value]
        else:
            out[field.name] = _value(field, value)
    return out


def _repeated(field: Any) -> bool:
    repeated = getattr(field, "is_repeated", None)  # protobuf 7 dropped ``label``
    if repeated is None:
        return bool(field.label == FieldDescriptor.LABEL_REPEATED)
    return bool(repeated)


def _is_map(field: Any) -> bool:
    message = field.message_type
    return _repeated(field) and message is not None and message.GetOptions().map_entry


def _value(field: Any, value: Any) -> _JSON:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        if isinstance(value, pb.InferParameter):
            return parameter_json(value)
        return to_json(value)
    if field.type == FieldDescriptor.TYPE_ENUM:
        described = field.enum_type.values_by_number.get(value)
        return value if described is None else described.name
    if field.type == FieldDescriptor.TYPE_BYTES:
        return {"b64": base64.b64encode(value).decode()}
    return value
