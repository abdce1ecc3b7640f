"""ReadBuffer's hand-encoded chunks: the same bytes protobuf makes, passed through as they are."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from accy.protocol.launch.v1 import launch_pb2 as pb
from accyd.doors.grpc.encoded import EncodedAnswers, encode_read_chunk


@given(offset=st.integers(0, 2**64 - 1), data=st.binary(max_size=4096))
def test_a_chunk_encodes_as_protobuf_encodes_the_message(offset: int, data: bytes) -> None:
    encoded = encode_read_chunk(offset, memoryview(bytearray(data)))
    assert encoded == pb.ReadBufferChunk(offset=offset, data=data).SerializeToString()
    parsed = pb.ReadBufferChunk.FromString(encoded)
    assert (parsed.offset, parsed.data) == (offset, data)


def test_a_megabyte_chunk_at_a_large_offset_round_trips() -> None:
    data = bytes(range(256)) * 4096
    parsed = pb.ReadBufferChunk.FromString(encode_read_chunk(3 << 40, data))
    assert (parsed.offset, parsed.data) == (3 << 40, data)


@pytest.mark.parametrize("offset", [-1, 2**64])
def test_an_offset_outside_uint64_is_refused(offset: int) -> None:
    with pytest.raises(ValueError, match="uint64"):
        encode_read_chunk(offset, b"x")


class Registry:
    """Records what reaches the server."""

    def __init__(self) -> None:
        self.registered: dict[str, grpc.RpcMethodHandler[object, object]] = {}
        self.generic = 0

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        self.generic += 1

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler[object, object]]
    ) -> None:
        self.registered = handlers


def test_only_the_named_method_passes_bytes_and_still_encodes_messages() -> None:
    def stream(request: object, context: object) -> object:
        return iter(())

    message = pb.ReadBufferChunk(offset=5, data=b"abc")
    make = grpc.unary_stream_rpc_method_handler
    handlers = {
        "ReadBuffer": make(stream, response_serializer=pb.ReadBufferChunk.SerializeToString),
        "Other": make(stream, response_serializer=pb.ReadBufferChunk.SerializeToString),
    }
    server = Registry()
    EncodedAnswers(server, ["ReadBuffer"]).add_registered_method_handlers("svc", handlers)
    assert server.generic == 1 and set(server.registered) == {"ReadBuffer", "Other"}
    reads = server.registered["ReadBuffer"].response_serializer
    assert reads is not None
    assert reads(b"as is") == b"as is"
    assert reads(message) == message.SerializeToString()
    assert server.registered["Other"] is handlers["Other"]


def test_a_method_that_does_not_stream_answers_cannot_pass_bytes() -> None:
    unary = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    with pytest.raises(TypeError, match="server-streaming"):
        EncodedAnswers(Registry(), ["Ping"]).add_registered_method_handlers("svc", {"Ping": unary})
