"""The device worker's wire protocol: frames, opcodes, and how errors cross the channel.

One ``multiprocessing.connection.Connection`` over a ``socketpair`` joins the
front (``WorkerBackend``, in the daemon) and one worker (``accyd.workers.worker``,
a child process). Everything here is the single place the protocol is written.

Frames
------
A frame is one ``send_bytes`` holding a 4-byte little-endian count ``n`` and a
pickle (protocol 5) of the frame's object, then ``n`` more ``send_bytes``: the
pickle's out-of-band buffers (``pickle.PickleBuffer``, used for bulk data so it
is never copied into the pickle). Each side writes a frame under one lock, so
frames from many threads never interleave.

Front to worker: each frame is a ``list`` of ops, in the order the front's
callers made them (one-way ops batch up until a flush, see ``WorkerBackend``).
An op is a tuple whose first item is its opcode. ``call`` is the id of a
round trip, answered by ``REPLY``/``FAILED``; ``sid`` is a stream id (``None``:
the backend's default stream). Every other id (buffer ``bid``, kernel ``kid``,
artifact ``aid``, prepared ``pid``, event ``eid``, notification ``nid``) is
assigned by the front; the worker maps it to its backend's real object.

=================  ====================================================  =========
op                 fields after the opcode                               answer
=================  ====================================================  =========
``CLOSE``          (none): close the backend and exit 0                  exit
``ALLOCATE``       call, bid, byte_size, alignment, zero                 address
``CREATE_ARTIFACT``call, aid, ``ArtifactRequest``                        None
``CLOSE_ARTIFACT`` aid                                                   one-way
``LOAD``           call, aid, kid                                        None
``LAUNCH``         sid, *launch* (below)                                 one-way
``PREPARE``        call, pid, tuple of (sid, *launch*)                   None
``REPLAY``         pid, sid                                              one-way
``CLOSE_PREPARED`` pid                                                   one-way
``DESTROY_BUFFER`` bid                                                   one-way
``DESTROY_KERNEL`` kid                                                   one-way
``SYNCHRONIZE``    call, sid (``ALL_STREAMS``: the whole device)         None
``CREATE_STREAM``  call, sid                                             None
``DESTROY_STREAM`` sid                                                   one-way
``RECORD``         eid, sid                                              one-way
``WAIT_EVENT``     sid, eid                                              one-way
``EVENT_DONE``     call, eid                                             bool
``NOTIFY``         nid, sid                                              ``NOTIFIED``
``NOTIFY_EVENT``   nid, eid, sid                                         ``NOTIFIED``
``DROP_QUEUED``    call, sid                                             None
``SYNC_EVENT``     call, eid                                             None
``DESTROY_EVENT``  eid                                                   one-way
``WRITE``          call, bid, offset, total, sid, first chunk            None
``WRITE_MORE``     call, next chunk (until ``total`` bytes came)         (the WRITE)
``READ``           call, bid, offset, size, sid                          ``DATA``..., None
=================  ====================================================  =========

*launch* is ``kid, bids, scalars, grid, block, shared_memory_bytes,
diagnostic_id`` with ``scalars`` as ``(dtype value, number)`` pairs (enums and
dataclasses cost 20 µs to pickle; plain tuples 1 µs).

Worker to front: each frame is one tuple.

============  ===========================  ==============================================
frame         fields                       meaning
============  ===========================  ==============================================
``READY``     info dict                    the backend is made: ``kind``, ``formats``,
                                           ``device_name``, ``pid``
``REPLY``     call, value                  a round trip's result
``FAILED``    call, encoded error          a round trip's error (``encode_error``)
``DATA``      call, chunk                  part of a ``READ``'s bytes, in order
``NOTIFIED``  nid                          a notification's work is over: run its callback
``FATAL``     encoded error                the worker exits now (a ``DeviceFault``, or a
                                           backend that could not be made before ``READY``)
============  ===========================  ==============================================

Bulk data moves in chunks of at most ``CHUNK_BYTES``, each its own frame, so a
large copy never holds either side's send lock for long.
"""

from __future__ import annotations

import builtins
import pickle
import struct
from multiprocessing.connection import Connection
from typing import Any

from accyd import errors

__all__ = [
    "ALL_STREAMS",
    "CHUNK_BYTES",
    "EncodedError",
    "Op",
    "decode_error",
    "encode_error",
    "recv_frame",
    "send_frame",
]

CHUNK_BYTES = 1 << 20
"""The most bytes of buffer data one frame carries."""

ALL_STREAMS = -1
"""``SYNCHRONIZE``'s stream id for the whole device (``synchronize(None)``)."""


class Op:
    """Opcodes: front to worker (ops in a batch) and worker to front (frames)."""

    # front -> worker
    CLOSE = 0
    ALLOCATE = 1
    CREATE_ARTIFACT = 2
    CLOSE_ARTIFACT = 3
    LOAD = 4
    LAUNCH = 5
    PREPARE = 6
    REPLAY = 7
    CLOSE_PREPARED = 8
    DESTROY_BUFFER = 9
    DESTROY_KERNEL = 10
    SYNCHRONIZE = 11
    CREATE_STREAM = 12
    DESTROY_STREAM = 13
    RECORD = 14
    WAIT_EVENT = 15
    EVENT_DONE = 16
    NOTIFY = 17
    NOTIFY_EVENT = 18
    DROP_QUEUED = 19
    SYNC_EVENT = 20
    DESTROY_EVENT = 21
    WRITE = 22
    WRITE_MORE = 23
    READ = 24
    COUNT = 25

    # worker -> front
    READY = 100
    REPLY = 101
    FAILED = 102
    DATA = 103
    NOTIFIED = 104
    FATAL = 105


_COUNT = struct.Struct("<I")


def send_frame(conn: Connection, obj: Any) -> None:
    """Send ``obj`` as one frame; the caller holds its side's send lock."""
    buffers: list[pickle.PickleBuffer] = []
    body = pickle.dumps(obj, 5, buffer_callback=buffers.append)
    conn.send_bytes(_COUNT.pack(len(buffers)) + body)
    for buffer in buffers:
        conn.send_bytes(buffer.raw())


def recv_frame(conn: Connection) -> Any:
    """Receive one frame (blocking); ``EOFError`` or ``OSError`` once the peer is gone."""
    head = conn.recv_bytes()
    (count,) = _COUNT.unpack_from(head)
    buffers = [conn.recv_bytes() for _ in range(count)]
    return pickle.loads(memoryview(head)[_COUNT.size :], buffers=buffers)


EncodedError = tuple[str, str, dict[str, Any]]
"""(class name, message, attributes): an exception as it crosses the channel."""


def encode_error(error: BaseException) -> EncodedError:
    """An exception as plain data: domain errors keep their class and fields."""
    if isinstance(error, errors.AccyError):
        attributes = {
            key: value
            for key, value in vars(error).items()
            if isinstance(value, str | int | float | bool | type(None))
        }
        return type(error).__name__, error.message, attributes
    return type(error).__name__, str(error), {}


def decode_error(encoded: EncodedError) -> Exception:
    """The exception ``encode_error`` described: the same domain class, message and fields.

    A builtin exception comes back as its class; anything else as ``RuntimeError``
    naming the class (the front cannot import what the worker raised)."""
    name, message, attributes = encoded
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, errors.AccyError):
        error = cls.__new__(cls)
        Exception.__init__(error, message)
        error.__dict__.update(attributes)
        error.message = message
        error.field = attributes.get("field")
        return error
    builtin = getattr(builtins, name, None)
    if isinstance(builtin, type) and issubclass(builtin, Exception):
        try:
            made: Exception = builtin(message)
        except Exception:  # a builtin with another signature (UnicodeDecodeError)
            made = RuntimeError(f"{name}: {message}")
        return made
    return RuntimeError(f"{name}: {message}")
