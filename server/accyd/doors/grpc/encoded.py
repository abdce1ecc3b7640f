"""ReadBuffer's chunks sent as encoded bytes: no message built around a megabyte of data.

Building a ``ReadBufferChunk`` copies the chunk into the message, and encoding
it copies it again; on the H200's host the two cost about 230 µs per MiB even
with the daemon's malloc settings, on the event loop's thread. A chunk is
instead encoded by hand (two fields: a varint and the bytes) with one copy,
on the thread that copies it off the device, and the method's serializer
passes ``bytes`` through as they are. Clients parse it as the message it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc

__all__ = ["EncodedAnswers", "encode_read_chunk"]

_OFFSET_TAG = b"\x08"  # field 1 (offset), varint
_DATA_TAG = b"\x12"  # field 2 (data), length-delimited


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_read_chunk(offset: int, data: bytes | bytearray | memoryview) -> bytes:
    """``ReadBufferChunk(offset=offset, data=data)``, encoded as protobuf would, in one copy."""
    if not 0 <= offset < 1 << 64:
        raise ValueError(f"offset {offset} is not a uint64")
    size = memoryview(data).nbytes
    # proto3 leaves out fields that hold their default: a zero offset, empty data.
    head = _OFFSET_TAG + _varint(offset) if offset else b""
    if not size:
        return head
    return b"".join((head, _DATA_TAG, _varint(size), data))


class EncodedAnswers:
    """Stands in for the server in a generated ``add_*Servicer_to_server`` call.

    The named methods' answers may be ``bytes`` already encoded, sent as they
    are; messages are encoded as usual. Everything is passed on to ``server``.
    """

    def __init__(self, server: Any, methods: Sequence[str]) -> None:
        self._server = server
        self._methods = frozenset(methods)

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        """Ignored: the same handlers come again, by name, to the call below."""

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        changed = {
            name: _passing_bytes(handler) if name in self._methods else handler
            for name, handler in handlers.items()
        }
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, changed),)
        )
        self._server.add_registered_method_handlers(service, changed)


def _passing_bytes(handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
    """``handler`` (unary-stream) with a serializer that sends ``bytes`` as they are."""
    encode: Callable[[Any], bytes] | None = handler.response_serializer
    if handler.unary_stream is None or encode is None:
        raise TypeError("only server-streaming methods with a serializer send encoded answers")

    def serialize(answer: Any) -> bytes:
        return answer if isinstance(answer, bytes) else encode(answer)

    return grpc.unary_stream_rpc_method_handler(
        handler.unary_stream,
        request_deserializer=handler.request_deserializer,
        response_serializer=serialize,
    )
