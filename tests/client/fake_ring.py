"""RingStream for the service double: ring records taken in order, counters and entries back.

It speaks the ring's layout (``accy.protocol.ring``) as the daemon does, enough
for the client's pipelined launches: binds, unbinds and launches of the
double's one pipeline (its one scalar ``n``), each launch run by the double's
own ``_launch`` so that delays, refusals and faults act the same on both paths.
A refusal becomes an error entry naming the record; a launch's ``done``
advances after the double's ``answer_delay``.
"""

from __future__ import annotations

import queue
import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from accy.protocol import ring as layout
from accy.protocol.launch.v1 import launch_pb2 as pb

GONE = "gone"
"""Put in a stream's queue: the stream breaks as if the daemon's process exited."""

_BY_CODE = {
    code_pb2.INVALID_ARGUMENT: "LAUNCH_ARGUMENT_MISMATCH",
    code_pb2.NOT_FOUND: "NOT_FOUND",
    code_pb2.UNIMPLEMENTED: "UNSUPPORTED",
}
"""The domain reason a ring entry carries for a refusal the double names otherwise (an entry
has no status code: the client reads it from the reason, as for the daemon's)."""


class Refusal(Exception):
    """A refusal, as the google.rpc.Status to abort a call with (or to write as an entry)."""

    def __init__(self, status: status_pb2.Status) -> None:
        super().__init__(status.message)
        self.status = status


def refusal(code: int, message: str, reason: str, **extra: str) -> status_pb2.Status:
    """A google.rpc.Status carrying ErrorInfo and, for ``field``, a BadRequest."""
    details = []
    info = any_pb2.Any()
    metadata = {k: v for k, v in extra.items() if k != "field"}
    info.Pack(error_details_pb2.ErrorInfo(reason=reason, domain="accy.dev", metadata=metadata))
    details.append(info)
    if "field" in extra:
        bad = any_pb2.Any()
        bad.Pack(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(
                        field=extra["field"], description=message
                    )
                ]
            )
        )
        details.append(bad)
    return status_pb2.Status(code=code, message=message, details=details)


def entry(seq: int, status: status_pb2.Status, what: str) -> bytes:
    """The error entry of record ``seq`` refused with ``status`` (its ErrorInfo, BadRequest)."""
    reason, field, metadata = "UNAVAILABLE", "", {}
    for detail in status.details:
        info, bad = error_details_pb2.ErrorInfo(), error_details_pb2.BadRequest()
        if detail.Unpack(info):
            reason, metadata = info.reason, dict(info.metadata)
        elif detail.Unpack(bad) and bad.field_violations:
            field = bad.field_violations[0].field
    if reason != "DEVICE_LOST":
        reason = _BY_CODE.get(status.code, reason)
    device = int(metadata["device"]) if metadata.get("scope") == "device" else None
    session = layout.fault_origin(metadata.get("session"), device) if "session" in metadata else b""
    message = f"{what}: {status.message}".encode()[: layout.MESSAGE_BYTES]
    head = layout.ERROR_ENTRY.pack(
        seq, reason.encode()[:32], field.encode()[: layout.FIELD_BYTES], session, len(message)
    )
    return (head + message).ljust(layout.ERROR_SIZE, b"\0")


class FakeRing:
    """One RingStream of the double: its handles, counters and error entries."""

    def __init__(
        self, launch: Callable[[pb.LaunchRequest], object], owns: Callable[[str, str], bool]
    ) -> None:
        self._launch = launch
        self._owns = owns
        self._handles: dict[int, str] = {}
        self.tail = self.done = 0
        self.entries: list[bytes] = []
        self._told = 0

    def take(self, record: bytes) -> None:
        """Take one record: bind, unbind or launch; a refusal becomes an entry."""
        seq, kind, flags, handle, ops, res, count, *rest = layout.RECORD.unpack(
            record[: layout.RECORD.size]
        )
        handles, scalars = rest[:16], rest[16]
        length = record[layout.ID_OFFSET]
        object_id = record[layout.ID_OFFSET + 1 : layout.ID_OFFSET + 1 + length].decode()
        what = "record"
        try:
            if kind in (layout.Kind.BIND_SESSION, layout.Kind.BIND_BUFFER):
                role = "session" if kind == layout.Kind.BIND_SESSION else "buffer"
                if not self._owns(role, object_id):
                    raise _refused(code_pb2.NOT_FOUND, f"no {role} {object_id}", f"{role}_id")
                self._handles[handle] = object_id
            elif kind == layout.Kind.UNBIND:
                self._handles.pop(handle, None)
            elif kind == layout.Kind.LAUNCH:
                session = self._named(handle, "session")
                what = f"launch of session {session}"
                request = pb.LaunchRequest(
                    session_id=session,
                    operands=[self._named(h, "operands") for h in handles[:ops]],
                    results=[self._named(h, "results") for h in handles[ops : ops + res]],
                    wait=bool(flags & layout.NOTIFY),
                )
                if count == 1:
                    request.runtime_scalars["n"].u32 = struct.unpack_from("<I", scalars)[0]
                self._launch(request)
            else:
                raise _refused(code_pb2.UNIMPLEMENTED, "the double takes no copies", "kind")
        except Refusal as refused:
            self.entries.append(entry(seq, refused.status, what))
        self.tail += 1  # the double's launch ran (and waited its answer delay) already
        self.done += 1

    def _named(self, handle: int, role: str) -> str:
        found = self._handles.get(handle)
        if found is None:
            raise _refused(code_pb2.NOT_FOUND, f"no {role} bound to handle {handle}", role)
        return found

    def state(self) -> pb.RingState:
        """The counters now, with the entries written since the last state."""
        fresh = self.entries[self._told :]
        state = pb.RingState(
            tail=self.tail,
            done=self.done,
            errors=len(self.entries),
            first_error=self._told,
            entries=b"".join(fresh),
        )
        self._told = len(self.entries)
        return state


def _refused(code: int, message: str, field: str) -> Refusal:
    reason = "NOT_FOUND" if code == code_pb2.NOT_FOUND else "UNSUPPORTED"
    return Refusal(refusal(code, message, reason, field=field))


def serve_ring(
    ring: FakeRing,
    frames: Iterator[pb.RingFrame],
    context: grpc.ServicerContext,
    streams: list[queue.SimpleQueue[Any]],
) -> Iterator[pb.RingState]:
    """One RingStream: open, then take each frame's records on a thread of its own (in
    order), sending the counters after each record."""
    hello = next(frames)
    yield pb.RingState(slots=hello.slots or 1024)
    out: queue.SimpleQueue[Any] = queue.SimpleQueue()
    streams.append(out)

    def take() -> None:
        try:
            for frame in frames:
                records = frame.records
                for at in range(0, len(records), layout.SLOT_SIZE):
                    ring.take(records[at : at + layout.SLOT_SIZE])
                    out.put(ring.state())
        except grpc.RpcError:
            pass
        finally:
            out.put(None)

    threading.Thread(target=take, daemon=True).start()
    while (state := out.get()) is not None:
        if state == GONE:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the daemon's process went away")
        yield state
