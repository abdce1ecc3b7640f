"""A ring over a gRPC stream: the same-host ring's records, for a client that cannot map it.

A client on another host (a TCP target) keeps the ring's memory itself: an
ordinary ``Ring`` writes records into it and waits on its counters, exactly as
on a shared ring. ``RingStreamLink`` carries the rest over one ``RingStream``
call: the call's request iterator sends the records published since its last
frame (many in one message when the caller is ahead), and a reader thread
writes the daemon's counters and error entries back into the memory, waking a
caller that sleeps on them. So a launch costs the caller a record in memory,
and the daemon a record to check or replay, not a ``LaunchRequest`` each.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import select
import threading
from collections.abc import Callable, Iterator, Sequence

import grpc

from accy._ring import Ring, RingClosed
from accy._rpc import Stub
from accy.errors import AccyError, DeadlineExceeded
from accy.protocol import ring as layout
from accy.protocol.launch.v1 import launch_pb2 as pb

__all__ = ["FRAME_RECORDS", "STREAM_SLOTS", "RingStreamLink"]

STREAM_SLOTS = 1024
"""Records a stream ring holds: launches published and not done, at most."""
FRAME_RECORDS = 256
"""Records sent in one frame at most (64 KiB)."""

_HEAD, _TAIL, _DONE, _ERRORS = (
    layout.HEAD_WORD,
    layout.TAIL_WORD,
    layout.DONE_WORD,
    layout.ERRORS_WORD,
)
_CLIENT_WAITS, _DAEMON_WAITS, _CLOSED = (
    layout.CLIENT_WAITS_HALF,
    layout.DAEMON_WAITS_HALF,
    layout.CLOSED_HALF,
)


class _EventFds:
    """The stream's three eventfds (``submit``, ``complete``, ``stop``), closed by the last
    thread that uses them.

    The sender (in gRPC's request thread, which may sit in ``poll`` as the call ends), the
    reader and ``close()`` touch them only inside ``using()``; ``close()`` marks them
    closing, and they close as the last user leaves. A number closed while another thread
    still held it is soon another descriptor (the next Client's TCP socket): an 8-byte
    eventfd read there took the daemon's first HTTP/2 frame header from that connection,
    and a write would have put one in.
    """

    def __init__(self) -> None:
        self.submit = self.complete = self.stop = -1
        try:
            self.submit = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            self.complete = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            self.stop = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        except BaseException:
            self._close_now()
            raise
        self._lock = threading.Lock()
        self._users = 0
        self._closing = False

    @contextlib.contextmanager
    def using(self) -> Iterator[bool]:
        """Whether they are still open; they stay open until the block ends."""
        with self._lock:
            entered = not self._closing
            self._users += entered
        try:
            yield entered
        finally:
            if entered:
                with self._lock:
                    self._users -= 1
                    last = self._closing and self._users == 0
                if last:
                    self._close_now()

    def signal(self, fd: int) -> None:
        """Add one to eventfd ``fd`` (one of these), unless they are closing."""
        with self.using() as open_, contextlib.suppress(BlockingIOError, OSError):
            if open_:
                os.eventfd_write(fd, 1)

    def close(self) -> None:
        """Close them now, or as soon as the last thread using them is done (idempotent)."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            now = self._users == 0
        if now:
            self._close_now()

    def close_in_child(self) -> None:
        """In a forked child, where the threads that used them do not exist: close now."""
        self._closing = True
        self._close_now()

    def _close_now(self) -> None:
        for fd in (self.submit, self.complete, self.stop):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)


class RingStreamLink:
    """One ``RingStream`` call and the ring it carries (``ring``).

    Owns the call, the ring memory's local mapping and the eventfds the sender
    and reader share with ``ring`` (which owns its own copies); ``close()``
    ends the call (idempotent). The sender runs in gRPC's request thread; the
    reader is a daemon thread that ends with the call.
    """

    def __init__(
        self,
        stub: Stub,
        metadata: Sequence[tuple[str, str]],
        translate: Callable[[grpc.RpcError], AccyError],
        slots: int = STREAM_SLOTS,
    ) -> None:
        size = layout.ring_bytes(slots)
        memory = os.memfd_create("accy-ring-stream", os.MFD_CLOEXEC)
        try:
            os.ftruncate(memory, size)
            self._map = mmap.mmap(memory, size)
            layout.pack_header(self._map, slots)
            self._fds = fds = _EventFds()
            self.ring = Ring(os.dup(memory), os.dup(fds.submit), os.dup(fds.complete))
        finally:
            os.close(memory)
        # A waiter must not spin: the reader thread that moves the counters needs the GIL.
        self.ring.spin_seconds = 0.0
        self._words = memoryview(self._map).cast("Q")
        self._halves = memoryview(self._map).cast("I")
        self._slots = slots
        self._translate = translate
        self.error: AccyError | None = None
        """Why the call ended, if the daemon ended it with an error."""
        self._opened = threading.Event()
        self._closed = False
        self._ended = False
        """The call ended (the reader saw its end): nothing more is sent."""
        self._call = stub.RingStream(self._frames(), metadata=tuple(metadata))
        self._reader = threading.Thread(target=self._read, name="accy-ring-stream", daemon=True)
        self._reader.start()

    def opened(self, timeout: float) -> bool:
        """Wait for the daemon's first answer: whether it took the ring (else see ``error``)."""
        return self._opened.wait(timeout) and self.error is None and not self._closed

    # Sending ---------------------------------------------------------------------------

    def _frames(self) -> Iterator[pb.RingFrame]:
        """The call's messages: the opening frame, then the records published since the last
        frame, in frames of at most ``FRAME_RECORDS`` (never across the ring's end)."""
        yield pb.RingFrame(slots=self._slots)
        words, halves, mask = self._words, self._halves, self._slots - 1
        sent = 0
        fds = self._fds
        woken = select.poll()  # not select.select: it refuses descriptors numbered >= 1024
        woken.register(fds.submit, select.POLLIN)
        woken.register(fds.stop, select.POLLIN)
        try:
            while not (self._closed or self._ended):
                head = int(words[_HEAD])
                if head == sent:
                    halves[_DAEMON_WAITS] = 1  # the ring writes ``submit`` once it sees this
                    try:
                        with fds.using() as open_:
                            if not open_:
                                return
                            if int(words[_HEAD]) == sent:  # close() writes stop, then waits
                                woken.poll()
                                with contextlib.suppress(BlockingIOError):
                                    os.eventfd_read(fds.submit)
                    finally:
                        halves[_DAEMON_WAITS] = 0
                    continue
                first = sent & mask
                count = min(head - sent, FRAME_RECORDS, self._slots - first)
                at = layout.HEADER_SIZE + first * layout.SLOT_SIZE
                records = self._map[at : at + count * layout.SLOT_SIZE]
                yield pb.RingFrame(first=sent, records=records)
                sent += count
        except (ValueError, OSError):  # closed under the sender
            return

    # Reading ---------------------------------------------------------------------------

    def _read(self) -> None:
        """The reader thread: the daemon's counters and error entries into the memory."""
        words, halves = self._words, self._halves
        slots, size = layout.error_slots(), layout.ERROR_SIZE
        try:
            for state in self._call:
                if not self._opened.is_set():
                    self._opened.set()  # the first answer: the ring is open
                    continue
                entries = state.entries
                for index in range(len(entries) // size):
                    at = layout.error_offset(state.first_error + index, slots)
                    self._map[at : at + size] = entries[index * size : (index + 1) * size]
                # Entries before their count, the count before ``done``: a waiter that sees the
                # records done sees why any of them failed.
                words[_ERRORS] = state.errors
                words[_TAIL] = state.tail
                words[_DONE] = state.done
                if halves[_CLIENT_WAITS]:
                    self._wake()
        except grpc.RpcError as error:
            if not self._closed:
                self.error = self._translate(error)
                self.ring.closed_reason = f"the daemon ended the ring's stream: {self.error}"
        except (ValueError, OSError):
            return
        finally:
            with contextlib.suppress(ValueError):
                halves[_CLOSED] = 1
            self._ended = True
            self._fds.signal(self._fds.stop)  # the sender may sleep: nothing more to send
            self._wake()
            self._opened.set()

    def _wake(self) -> None:
        self._fds.signal(self._fds.complete)

    # Closing ---------------------------------------------------------------------------

    def close(self, drain: float = 0.0) -> None:
        """End the call (idempotent). With ``drain``, first wait up to that many seconds for
        the daemon to take every record published (they are enqueued then)."""
        if self._closed:
            return
        if drain > 0 and self.error is None:
            with contextlib.suppress(RingClosed, DeadlineExceeded, ValueError):
                self.ring.flush(drain)  # woken by the reader as the daemon takes them
        self._closed = True
        self._fds.signal(self._fds.stop)  # a sender asleep in poll wakes, and leaves them
        self._call.cancel()
        if threading.current_thread() is not self._reader:
            self._reader.join(1.0)
        self._fds.close()  # now, or as the reader or the sender lets go of them

    def close_in_child(self) -> None:
        """In a forked child: the call and its threads are the parent's; never write to the
        ring's memory (the parent's sender reads it) and let go of it here, taking no lock."""
        if self._closed:
            return
        self._closed = True
        self.ring.close_in_child()
        with contextlib.suppress(BufferError, ValueError, OSError):
            self._words.release()
            self._halves.release()
            self._map.close()
        self._fds.close_in_child()
