"""The door's .proto files against what tritonclient sends: every message, field and method.

The files were written from the protocol's documentation; this holds them to the wire:
each field accyd declares has the name, number, type and label of tritonclient's, every
message and method of the service is there, and accyd's model-config subset matches.
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator

import pytest
from google.protobuf import descriptor_pb2

from accyd.doors.kserve.protocol import model_config_pb2, open_inference_pb2
from tests.kserve.harness import Tools

_DUMP = """
import base64, json
from tritonclient.grpc import model_config_pb2, service_pb2
print(json.dumps({name: base64.b64encode(m.DESCRIPTOR.serialized_pb).decode()
                  for name, m in (("service", service_pb2), ("config", model_config_pb2))}))
"""

Message = descriptor_pb2.DescriptorProto


def _file(serialized: bytes) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    proto.ParseFromString(serialized)
    return proto


def _messages(
    prefix: str, messages: Iterator[Message] | list[Message]
) -> Iterator[tuple[str, Message]]:
    for message in messages:
        name = f"{prefix}.{message.name}"
        yield name, message
        yield from _messages(name, list(message.nested_type))


def _enums(proto: descriptor_pb2.FileDescriptorProto) -> dict[str, dict[str, int]]:
    found = {f"inference.{e.name}": {v.name: v.number for v in e.value} for e in proto.enum_type}
    for name, message in _messages("inference", list(proto.message_type)):
        for enum in message.enum_type:
            found[f"{name}.{enum.name}"] = {v.name: v.number for v in enum.value}
    return found


@pytest.fixture(scope="module")
def theirs(tools: Tools) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    done = subprocess.run(
        [str(tools.python), "-c", _DUMP], capture_output=True, text=True, timeout=120, check=True
    )
    return {k: _file(base64.b64decode(v)) for k, v in json.loads(done.stdout).items()}


@pytest.mark.parametrize(
    ("ours", "which", "every_message"),
    [(open_inference_pb2, "service", True), (model_config_pb2, "config", False)],
)
def test_each_declared_field_is_tritonclients(
    theirs: dict[str, descriptor_pb2.FileDescriptorProto],
    ours: object,
    which: str,
    every_message: bool,
) -> None:
    mine = _file(ours.DESCRIPTOR.serialized_pb)  # type: ignore[attr-defined]
    reference = dict(_messages("inference", list(theirs[which].message_type)))
    declared = dict(_messages("inference", list(mine.message_type)))
    if every_message:
        assert set(declared) == set(reference)
    assert set(declared) <= set(reference)
    for name, message in declared.items():
        fields = {f.name: f for f in reference[name].field}
        for field in message.field:
            assert field.name in fields, f"{name}.{field.name} is not tritonclient's"
            other = fields[field.name]
            assert (field.number, field.type, field.label, field.type_name) == (
                other.number,
                other.type,
                other.label,
                other.type_name,
            ), f"{name}.{field.name}"
            assert field.HasField("oneof_index") == other.HasField("oneof_index")
    their_enums = _enums(theirs[which])
    for name, values in _enums(mine).items():
        assert values.items() <= their_enums[name].items(), name


def test_every_method_is_served_as_tritonclient_calls_it(
    theirs: dict[str, descriptor_pb2.FileDescriptorProto],
) -> None:
    mine = _file(open_inference_pb2.DESCRIPTOR.serialized_pb)
    assert mine.package == theirs["service"].package == "inference"
    (service,) = mine.service
    (reference,) = theirs["service"].service
    assert service.name == reference.name == "GRPCInferenceService"

    def shape(methods: list[descriptor_pb2.MethodDescriptorProto]) -> dict[str, tuple[object, ...]]:
        return {
            m.name: (m.input_type, m.output_type, m.client_streaming, m.server_streaming)
            for m in methods
        }

    assert shape(list(service.method)) == shape(list(reference.method))
