"""The device worker's wire protocol: frames, opcodes, and how errors cross the channel.

One ``socketpair`` joins the front (``WorkerBackend``, in the daemon) and one
worker (``accyd.backends.worker.child.main``, a child process). Everything here is the
single place the protocol is written.

Frames
------
The channel is a ``socketpair`` (``SOCK_STREAM``). A frame is a header
(``<II``: the pickle's length, how many out-of-band buffers follow), one ``<Q``
length per buffer, the pickle (protocol 5) of the frame's object, then the
buffers' bytes: the pickle's ``pickle.PickleBuffer`` objects, used for bulk data
so it is never copied into the pickle. A frame without buffers is one
``sendall``; each side sends a frame under one lock, so frames from many
threads never interleave. ``FrameReader`` reads ahead (one ``recv`` may bring
many frames) and lands bulk bytes straight in their own buffer. (This is
``multiprocessing.connection``'s idea without its Python-level framing, which
cost 8 µs more per frame on the hot path.)

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
``REPLAY``         pid, sid, count                                       one-way
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
``PIN``            call, hid, front pid, fd, size, st_dev, st_ino        None/why
``UNPIN``          call, hid                                             None
``WRITE_SHARED``   call, bid, offset, sid, hid, start, size              None
``READ_SHARED``    call, bid, offset, sid, hid, start, size              None
``EXPORT``         call, bid                                             see below
=================  ====================================================  =========

*launch* is ``kid, bids, scalars, grid, block, shared_memory_bytes,
diagnostic_id`` with ``scalars`` as ``(dtype value, number)`` pairs (enums and
dataclasses cost 20 µs to pickle; plain tuples 1 µs).

Shared host memory (``accyd.backends.worker.front.pins`` in the front, ``served_pins`` in the
worker): ``PIN`` asks the worker to map the file the front holds as descriptor
``fd`` (through ``/proc/<front pid>/fd/<fd>``; ``st_dev``/``st_ino`` say which
file it must be) for ``size`` bytes and pin that mapping with its backend's
``pin_host``, as pin ``hid``; the answer is None, or why it could not map it
(the front then copies bytes). ``WRITE_SHARED``/``READ_SHARED`` copy between
bytes ``start..start+size`` of pin ``hid`` and the buffer: a round trip like
``WRITE``/``READ``, with no bytes on the channel. ``UNPIN`` waits for the copies
using the pin, unpins and unmaps it.

``ALLOCATE`` carries ``exportable`` after ``zero``. ``EXPORT`` sends the new
descriptor of buffer ``bid``'s memory on the *lane* (a second socketpair, for
``SCM_RIGHTS`` only) and then answers ``(kind value, mapping size, offset, GPU
UUID)``; the front takes the descriptor from the lane once the answer came.

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
``ALIVE``     (none)                       the worker runs: sent every ``HEARTBEAT_SECONDS``
                                           from ``READY`` on, by a thread of its own
============  ===========================  ==============================================

A worker whose channel stays silent (no frame at all) for the front's hang bound
is declared lost (``accyd.backends.worker.front.liveness``): stopped, hung or starved, its
calls would otherwise wait forever.

Bulk data moves in chunks of at most ``CHUNK_BYTES``, each its own frame, so a
large copy never holds either side's send lock for long.
"""

from __future__ import annotations

import builtins
import pickle
import socket
import struct
from typing import Any

from accyd import errors

__all__ = [
    "ALL_STREAMS",
    "CHUNK_BYTES",
    "HEARTBEAT_SECONDS",
    "EncodedError",
    "FrameReader",
    "Op",
    "decode_error",
    "encode_error",
    "send_frame",
]

CHUNK_BYTES = 1 << 20
"""The most bytes of buffer data one frame carries."""

ALL_STREAMS = -1
"""``SYNCHRONIZE``'s stream id for the whole device (``synchronize(None)``)."""

HEARTBEAT_SECONDS = 0.25
"""How often a ready worker says it runs (``ALIVE``), whatever else it sends."""


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
    PIN = 25
    UNPIN = 26
    WRITE_SHARED = 27
    READ_SHARED = 28
    EXPORT = 29
    SPLIT_SMS = 30
    COUNT = 31

    # worker -> front
    READY = 100
    REPLY = 101
    FAILED = 102
    DATA = 103
    NOTIFIED = 104
    FATAL = 105
    ALIVE = 106


_HEAD = struct.Struct("<II")
_SIZE = struct.Struct("<Q")
_READ_AHEAD = 256 << 10


def send_frame(sock: socket.socket, obj: Any) -> None:
    """Send ``obj`` as one frame; the caller holds its side's send lock."""
    buffers: list[pickle.PickleBuffer] = []
    body = pickle.dumps(obj, 5, buffer_callback=buffers.append)
    if not buffers:
        sock.sendall(_HEAD.pack(len(body), 0) + body)
        return
    raws = [buffer.raw() for buffer in buffers]
    sizes = b"".join(_SIZE.pack(raw.nbytes) for raw in raws)
    sock.sendall(_HEAD.pack(len(body), len(raws)) + sizes + body)
    for raw in raws:
        sock.sendall(raw)


class FrameReader:
    """Reads frames from one socket, for one thread. ``recv`` raises ``EOFError`` at the
    end of the stream (the peer is gone) and ``OSError`` if the socket breaks."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = bytearray(_READ_AHEAD)
        self._view = memoryview(self._buffer)
        self._start = 0
        self._end = 0

    def _fill(self, need: int) -> None:
        """Make ``need`` bytes available from ``_start`` (``need`` <= the read-ahead)."""
        if self._end - self._start >= need:
            return
        if self._start:
            kept = self._end - self._start
            self._view[:kept] = self._view[self._start : self._end]
            self._start, self._end = 0, kept
        while self._end < need:
            got = self._sock.recv_into(self._view[self._end :])
            if not got:
                raise EOFError("the channel closed")
            self._end += got

    def _take(self, size: int) -> memoryview | bytearray:
        """The next ``size`` bytes: a view of the read-ahead (valid until the next take)
        or, past it, a buffer of their own filled straight from the socket."""
        if size <= _READ_AHEAD:
            self._fill(size)
            view = self._view[self._start : self._start + size]
            self._start += size
            return view
        own = bytearray(size)
        target = memoryview(own)
        have = min(self._end - self._start, size)
        target[:have] = self._view[self._start : self._start + have]
        self._start += have
        while have < size:
            got = self._sock.recv_into(target[have:])
            if not got:
                raise EOFError("the channel closed")
            have += got
        return own

    def recv(self) -> Any:
        """The next frame's object (blocking)."""
        self._fill(_HEAD.size)
        length, count = _HEAD.unpack_from(self._buffer, self._start)
        self._start += _HEAD.size
        sizes = []
        for _ in range(count):
            self._fill(_SIZE.size)
            sizes.append(_SIZE.unpack_from(self._buffer, self._start)[0])
            self._start += _SIZE.size
        if not sizes:  # the hot path: unpickle straight from the read-ahead
            return pickle.loads(self._take(length))
        body = bytes(self._take(length))  # copied: the next takes may move the read-ahead
        buffers = [bytes(self._take(n)) if n <= _READ_AHEAD else self._take(n) for n in sizes]
        return pickle.loads(body, buffers=buffers)


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
