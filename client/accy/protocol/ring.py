"""The same-host submission ring's memory layout, shared by the daemon and its clients.

One ring belongs to one client. The daemon makes it (a ``memfd``) and hands it
over a Unix socket with ``SCM_RIGHTS``, with two eventfds: ``submit`` (the
client wakes the daemon's submitter) and ``complete`` (the submitter wakes a
client that sleeps on a completion). Nothing in it has a name another process
could open.

Layout, little-endian, each counter on its own 64-byte line::

    0     magic u32, version u32, slot_count u32, slot_size u32, error_slots u32
    64    head u64          client: records published (the next record's seq)
    128   tail u64          daemon: records taken (checked, then enqueued or refused)
    192   done u64          daemon: every record with seq < done has finished or was refused
    256   client_waits u32  client: 1 while it sleeps on ``complete``
    320   daemon_waits u32  daemon: 1 while the submitter sleeps on ``submit``
    384   errors u64        daemon: error entries written so far
    448   closed u32        daemon: the ring is closed (client detached or daemon stopping)
    452   wait_spin u32     daemon: how long a client's wait may spin before it sleeps, in µs,
                            with ``SPIN_SET`` or'ed in once published (unset: the client's own),
                            and ``SPIN_DEVICE`` while the device launcher serves the ring
    456   left u64          device: seq + 1 of the last record the device launcher left to
                            the daemon's CPU path (0: none); only on a ring it serves

A ring the device launcher serves (the client asked for it with ``device_waits``, and the
daemon says so with ``SPIN_DEVICE``): the GPU itself takes each launch that matches a checked
ticket and counts ``done`` up when it is over, and nobody writes ``complete`` for it. Its
client therefore spins yielding its CPU, then naps in short polls, and kicks ``submit``
whenever ``left`` passes ``done`` (a record the GPU left to the CPU path, which sleeps
otherwise). ``tail`` lags there: ``done`` also counts records taken.
    512   error entries     error_slots x ERROR_SIZE, entry i % error_slots
    HEADER_SIZE  records    slot_count x SLOT_SIZE, record seq at slot seq % slot_count

A record (``SLOT_SIZE`` bytes)::

    0   seq u64      its sequence number (the daemon refuses a slot whose seq is not the expected)
    8   kind u16     LAUNCH, BIND_SESSION, BIND_BUFFER, UNBIND, COPY
    10  flags u16    NOTIFY: the client will wait for this record, so signal it promptly;
                     TO_SEGMENT: a COPY from the buffer into the segment (else the reverse)
    12  handle u32   LAUNCH: the session's handle; BIND/UNBIND: the handle named; COPY: the
                     buffer's handle
    16  operands u8, results u8, scalars u8, pad u8
    20  buffer handles u32 x MAX_BUFFERS (operands then results)
    84  scalar values, 8 bytes each x MAX_SCALARS, each the scalar's own dtype little-endian,
        zero-padded (an f32 is its 4 bytes, not a double)
    148 id length u8, id bytes (BIND_*: the session or buffer id the handle stands for;
        COPY: the segment's id)

A COPY record moves bytes between one of the client's shared segments and one of its
buffers, as ``CopySegment`` does: at ``SCALARS_OFFSET`` it holds ``COPY_FIELDS``
(segment offset, buffer offset, size). The daemon takes no record of that ring after
it until the copy is over, so the ring's order holds for it like for launches.

An error entry (``ERROR_SIZE`` bytes): seq u64, reason (32 bytes, the domain error's
reason as gRPC's ErrorInfo carries it, NUL-padded), field (``FIELD_BYTES``), the
session a device fault names (48 bytes: ``fault_origin``), message length u16,
message bytes (UTF-8, cut to ``MESSAGE_BYTES``).
"""

from __future__ import annotations

import enum
import mmap
import struct

__all__ = [
    "CLIENT_WAITS",
    "CLIENT_WAITS_HALF",
    "CLOSED",
    "CLOSED_HALF",
    "COPY_FIELDS",
    "DAEMON_WAITS",
    "DAEMON_WAITS_HALF",
    "DONE",
    "DONE_WORD",
    "ERRORS",
    "ERRORS_WORD",
    "ERROR_BASE",
    "ERROR_ENTRY",
    "ERROR_SIZE",
    "FIELD_BYTES",
    "HANDOFF_SUFFIX",
    "HEAD",
    "HEADER",
    "HEADER_SIZE",
    "HEAD_WORD",
    "ID_OFFSET",
    "LAUNCH_KEY",
    "LEFT",
    "LEFT_WORD",
    "MAGIC",
    "MAX_BUFFERS",
    "MAX_ID_BYTES",
    "MAX_SCALARS",
    "MESSAGE_BYTES",
    "NOTIFY",
    "RECORD",
    "RECORD_FIXED",
    "RING_ENV",
    "SCALARS_OFFSET",
    "SLOT_SIZE",
    "SPIN_DEVICE",
    "SPIN_SET",
    "TAIL",
    "TAIL_WORD",
    "TICKET_BYTES",
    "TO_SEGMENT",
    "VERSION",
    "WAIT_SPIN",
    "WAIT_SPIN_HALF",
    "Kind",
    "error_offset",
    "error_slots",
    "fault_origin",
    "pack_header",
    "parse_fault_origin",
    "ring_bytes",
]

MAGIC = 0x47524341  # "ACRG"
VERSION = 1
HEADER = struct.Struct("<IIIII")
HEAD, TAIL, DONE, CLIENT_WAITS, DAEMON_WAITS, ERRORS, CLOSED, LEFT = (
    64,
    128,
    192,
    256,
    320,
    384,
    448,
    456,
)
HEAD_WORD, TAIL_WORD, DONE_WORD, ERRORS_WORD, LEFT_WORD = (
    o >> 3 for o in (HEAD, TAIL, DONE, ERRORS, LEFT)
)
"""The u64 counters' indexes in the ring's memory seen as 8-byte words."""
CLIENT_WAITS_HALF, DAEMON_WAITS_HALF, CLOSED_HALF = (
    o >> 2 for o in (CLIENT_WAITS, DAEMON_WAITS, CLOSED)
)
"""The u32 flags' indexes in the ring's memory seen as 4-byte words."""
WAIT_SPIN = CLOSED + 4
"""On the line of ``closed``, which a waiting client reads anyway; the daemon writes both
seldom (``accyd.ring.waiting``)."""
WAIT_SPIN_HALF = WAIT_SPIN >> 2
SPIN_SET = 1 << 31
"""Or'ed into ``wait_spin`` by a daemon that publishes it; the low bits are microseconds."""
SPIN_DEVICE = 1 << 30
"""Or'ed into ``wait_spin`` while the device launcher serves the ring (see the top)."""
ERROR_BASE = 512
ERROR_SIZE = 384
FIELD_BYTES = 64
MESSAGE_BYTES = ERROR_SIZE - 154
HEADER_SIZE = 16384
"""Room for (HEADER_SIZE - ERROR_BASE) // ERROR_SIZE error entries, and page-aligned records."""

SLOT_SIZE = 256
MAX_BUFFERS = 16
MAX_SCALARS = 8
SCALARS_OFFSET = 84
ID_OFFSET = RECORD_BYTES = 148
MAX_ID_BYTES = SLOT_SIZE - ID_OFFSET - 1
RECORD = struct.Struct("<QHHIBBBx16I64s")
"""seq, kind, flags, handle, operand/result/scalar counts, buffer handles, scalar bytes."""
RECORD_FIXED = struct.Struct("<HHIBBBx16I")
"""A launch record from byte 8 to ``SCALARS_OFFSET``: what stays the same from one launch of
the same session on the same buffers to the next (kind, flags, handle, counts, handles)."""
ERROR_ENTRY = struct.Struct("<Q32s64s48sH")
"""seq, reason, field, the session a device fault names, message length; the message follows."""

LAUNCH_KEY = 12
"""Where a launch record's bytes that say what it launches begin (handle, counts, buffer
handles, scalars, up to ``RECORD.size``): what a ticket matches."""

COPY_FIELDS = struct.Struct("<QQQ")
"""A COPY record's segment offset, buffer offset and size, at ``SCALARS_OFFSET``."""

NOTIFY = 1
TO_SEGMENT = 2
TICKET_BYTES = 32
HANDOFF_SUFFIX = ".rings"
"""The handoff socket sits beside the daemon's socket, named after it with this suffix."""
RING_ENV = "ACCY_RING"
"""Set to 0 to keep a local client on plain gRPC."""


class Kind(enum.IntEnum):
    LAUNCH = 1
    BIND_SESSION = 2
    BIND_BUFFER = 3
    UNBIND = 4
    COPY = 5


def ring_bytes(slot_count: int) -> int:
    """The size of a ring of ``slot_count`` records."""
    return HEADER_SIZE + slot_count * SLOT_SIZE


def error_slots() -> int:
    return (HEADER_SIZE - ERROR_BASE) // ERROR_SIZE


def error_offset(index: int, slots: int) -> int:
    """Where error entry ``index`` is written in a ring of ``slots`` error entries."""
    return ERROR_BASE + (index % slots) * ERROR_SIZE


def pack_header(memory: bytearray | memoryview | mmap.mmap, slot_count: int) -> None:
    """Write a new ring's header (magic, version, sizes) into ``memory``: the daemon's rings,
    and a client's own copy of a ring carried over a stream."""
    HEADER.pack_into(memory, 0, MAGIC, VERSION, slot_count, SLOT_SIZE, error_slots())


def fault_origin(session: str | None, device: int | None) -> bytes:
    """The session slot of a ``DEVICE_LOST`` entry: the session that faulted, then
    ``@<device>`` when the fault took that one device and the daemon lives on."""
    text = (session or "") + ("" if device is None else f"@{device}")
    return text.encode()[:48]


def parse_fault_origin(text: str) -> tuple[str, str | None]:
    """``(session, device)`` from a session slot; ``device`` is ``None`` for the whole daemon."""
    session, at, device = text.partition("@")
    return session, (device if at else None)
