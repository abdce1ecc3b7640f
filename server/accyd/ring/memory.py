"""A ring's memory and eventfds: made by the daemon, sealed, and handed to one client."""

from __future__ import annotations

import contextlib
import mmap
import os
import threading

from accy.protocol import ring as layout
from accyd.memfd import sealed_memfd

__all__ = ["RingMemory"]


class RingMemory:
    """The daemon's side of one ring: a sealed ``memfd`` mapped here, and two eventfds.

    The daemon owns all three descriptors and the mapping, and closes them in
    ``close()`` (idempotent). The memfd is sealed against shrinking before any
    client sees it, so a client that truncates its copy cannot make the daemon
    fault on a read past the end. Nothing the client writes is trusted: readers
    copy a record out before they look at it.

    With ``shared=False`` the memory is the daemon's alone (an anonymous
    mapping): a ring whose records arrive as messages (``RingStream``) is filled
    by the daemon itself, and its counters go back as messages. Its eventfds stay
    in the daemon: the stream's handler kicks ``submit`` and reads ``complete``,
    which the engine writes whenever the ring moves.

    An engine that takes the ring holds an export of ``map`` until it lets the
    ring go: close it only after (``close`` raises ``BufferError`` before).

    The eventfds are read and written under ``_fd_lock``, and never once closed: a
    descriptor number closed here is soon another's (a new client's TCP socket), and an
    8-byte eventfd write into it reads as an HTTP/2 frame header there (a copy thread's
    ``wake_client`` after the ring closed broke another client's connection that way).
    """

    def __init__(self, slot_count: int, *, shared: bool = True) -> None:
        if slot_count <= 0 or slot_count & (slot_count - 1):
            raise ValueError(f"slot_count must be a power of two, not {slot_count}")
        self.slot_count = slot_count
        self.size = layout.ring_bytes(slot_count)
        self.shared = shared
        self.fd = self.submit_fd = self.complete_fd = -1
        if not shared:
            self.map = mmap.mmap(-1, self.size)
        else:
            self.fd, self.map = sealed_memfd("accy-ring", self.size)
        try:
            self.submit_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            self.complete_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        except BaseException:
            self.map.close()
            if self.fd >= 0:
                os.close(self.fd)
            raise
        layout.pack_header(self.map, slot_count)
        # Counters go through word views: one aligned 8- or 4-byte store or load each, where
        # struct.pack_into writes byte by byte and a reader could see a torn value.
        self._words = memoryview(self.map).cast("Q")
        self._halves = memoryview(self.map).cast("I")
        self._closed = False
        self._fd_lock = threading.Lock()

    def fds(self) -> list[int]:
        """What the client receives, in this order: the memory, ``submit``, ``complete``."""
        return [self.fd, self.submit_fd, self.complete_fd]

    def u64(self, offset: int) -> int:
        return int(self._words[offset >> 3])

    def set_u64(self, offset: int, value: int) -> None:
        self._words[offset >> 3] = value

    def u32(self, offset: int) -> int:
        return int(self._halves[offset >> 2])

    def set_u32(self, offset: int, value: int) -> None:
        self._halves[offset >> 2] = value

    def record(self, seq: int) -> bytes:
        """A copy of record ``seq``'s slot (the client may change it while we read)."""
        at = layout.HEADER_SIZE + (seq & (self.slot_count - 1)) * layout.SLOT_SIZE
        return self.map[at : at + layout.SLOT_SIZE]

    def records(self, seq: int, count: int) -> bytes:
        """A copy of the slots of records ``seq`` .. ``seq + count - 1`` (``count`` at most the
        ring's slots), one after another: the client may change them while we read."""
        spans = self._spans(seq, count)
        if len(spans) == 1:
            start, end = spans[0]
            return self.map[start:end]
        return b"".join(self.map[start:end] for start, end in spans)

    def write(self, seq: int, records: bytes) -> None:
        """Put whole records ``seq`` onward into their slots (at most ``slot_count``): the
        daemon's own copy of what a ``RingStream`` client sent."""
        done = 0
        for start, end in self._spans(seq, len(records) // layout.SLOT_SIZE):
            self.map[start:end] = records[done : done + end - start]
            done += end - start

    def _spans(self, seq: int, count: int) -> tuple[tuple[int, int], ...]:
        """Where the slots of records ``seq`` .. ``seq + count - 1`` lie in the map: one span,
        or two where they wrap past the ring's end."""
        first = seq & (self.slot_count - 1)
        at = layout.HEADER_SIZE + first * layout.SLOT_SIZE
        fits = min(count, self.slot_count - first)
        if fits == count:
            return ((at, at + count * layout.SLOT_SIZE),)
        wrapped = layout.HEADER_SIZE + (count - fits) * layout.SLOT_SIZE
        return ((at, at + fits * layout.SLOT_SIZE), (layout.HEADER_SIZE, wrapped))

    def entries(self, first: int, end: int) -> tuple[int, bytes]:
        """Error entries ``first`` .. ``end - 1``, one after another, as written: the newest
        ``error_slots`` at most, so with the index of the first one returned."""
        slots = layout.error_slots()
        first = max(first, end - slots)
        return first, b"".join(
            self.map[at : at + layout.ERROR_SIZE]
            for at in (layout.error_offset(index, slots) for index in range(first, end))
        )

    def write_entry(
        self, index: int, seq: int, reason: str, field: str, session: bytes, message: str
    ) -> None:
        """Write error entry ``index`` (its slot comes round again past ``error_slots``),
        each part cut to its room; the caller then publishes the count."""
        data = message.encode()[: layout.MESSAGE_BYTES]
        at = layout.error_offset(index, layout.error_slots())
        layout.ERROR_ENTRY.pack_into(
            self.map,
            at,
            seq,
            reason.encode()[:32],
            field.encode()[: layout.FIELD_BYTES],
            session,
            len(data),
        )
        start = at + layout.ERROR_ENTRY.size
        self.map[start : start + len(data)] = data

    def drain_submit(self) -> None:
        with self._fd_lock, contextlib.suppress(BlockingIOError, OSError):
            if not self._closed:
                os.eventfd_read(self.submit_fd)

    def kick(self) -> None:
        """Wake whoever takes the ring, if it said it sleeps (a ring filled by the daemon)."""
        with self._fd_lock, contextlib.suppress(BlockingIOError, OSError):
            if not self._closed and self.u32(layout.DAEMON_WAITS):
                os.eventfd_write(self.submit_fd, 1)

    def drain_complete(self) -> None:
        with self._fd_lock, contextlib.suppress(BlockingIOError, OSError):
            if not self._closed:
                os.eventfd_read(self.complete_fd)

    def wake_client(self) -> None:
        # A hostile client can fill the counter; a full eventfd is not our problem.
        with self._fd_lock, contextlib.suppress(BlockingIOError, OSError):
            if not self._closed:
                os.eventfd_write(self.complete_fd, 1)

    def close(self) -> None:
        """Mark the ring closed, wake its client, close the descriptors and unmap; idempotent.
        Only once no engine holds the ring (``BufferError`` before: nothing was closed)."""
        if self._closed:
            return
        self.mark_closed()
        self._words.release()
        self._halves.release()
        try:
            self.map.close()
        except BufferError:  # an engine still holds it: the caller's mistake, kept visible
            self._words = memoryview(self.map).cast("Q")
            self._halves = memoryview(self.map).cast("I")
            raise
        with self._fd_lock:
            self._closed = True
            for fd in (self.fd, self.submit_fd, self.complete_fd):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)

    def mark_closed(self) -> None:
        """Tell the client the ring is closed (before the engine lets it go)."""
        with contextlib.suppress(ValueError):
            self.set_u32(layout.CLOSED, 1)
        self.wake_client()
