"""The client's side of a same-host submission ring: publish launch records, wait on ``done``.

A ``Ring`` is used by one thread at a time (the client serializes launches
through its lock). Records are written into the slot, then ``head`` is
advanced; the daemon copies each record before it checks it. A wait spins on
``done`` for ``spin_seconds`` or for the spin the daemon published in the ring's
header, whichever is less (``wait_spin``: the daemon says 0 once more clients wait than
it has CPUs to spare, so spinning never takes its engine's cores), then sleeps on the
``complete`` eventfd. On a ring the daemon's device launcher serves (``SPIN_DEVICE``) the
GPU launches and completes records itself: a wait there spins yielding its CPU, then naps
in short polls, and kicks the daemon when the GPU left a record to its CPU path. Errors
the daemon wrote (a refused or failed launch) are raised by the next call that
looks, naming the record, like CUDA's asynchronous errors.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import select
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from accy import _handoff
from accy.errors import DeadlineExceeded, FieldViolation, InvalidArgument
from accy.protocol import ring as layout

__all__ = ["Ring", "RingClosed", "RingError", "RingFull", "wait_spin_seconds"]

_HEADER_READ = struct.Struct("<IIIII")
_HEAD, _DONE, _ERRORS = layout.HEAD_WORD, layout.DONE_WORD, layout.ERRORS_WORD
_CLOSED, _DAEMON_WAITS = layout.CLOSED_HALF, layout.DAEMON_WAITS_HALF
_WAIT_SPIN, _SPIN_SET = layout.WAIT_SPIN_HALF, layout.SPIN_SET
_SPIN_DEVICE, _LEFT = layout.SPIN_DEVICE, layout.LEFT_WORD
_SPIN_US = ~(_SPIN_SET | _SPIN_DEVICE)
DEVICE_NAP_SECONDS = 200e-6
"""How long a wait on a ring the device serves sleeps between looks, once its spin is over:
nothing writes ``complete`` for a launch the GPU served."""
_FLAGS = 10
"""A record's flags' low byte."""
_SCALAR_BYTES = layout.ID_OFFSET - layout.SCALARS_OFFSET
SPIN_CPUS = 8
"""From how many usable CPUs a wait spins long (``wait_spin_seconds``)."""


def wait_spin_seconds() -> float:
    """How long a wait spins on ``done`` before it sleeps: 1 ms where this process may run on
    8 CPUs or more (CUDA's own automatic policy spins where cores are plenty), else 100 µs.
    Waking a client that sleeps costs tens of microseconds; a spin only its own core."""
    return 1e-3 if len(os.sched_getaffinity(0)) >= SPIN_CPUS else 100e-6


class RingClosed(Exception):
    """The daemon closed the ring (detached, stopping, or the ring was misused)."""


class RingFull(Exception):
    """No slot came free within the caller's timeout (nothing was published)."""


@dataclass(frozen=True, slots=True)
class RingError:
    """A record the daemon refused or that failed: its seq and the domain error's parts."""

    seq: int
    reason: str
    field: str
    message: str
    session: str = ""
    """For ``DEVICE_LOST``: the session whose work faulted."""


class Ring:
    """One client's ring: the mapping and eventfds received from the daemon; closes them."""

    def __init__(self, memory_fd: int, submit_fd: int, complete_fd: int) -> None:
        try:
            size = os.fstat(memory_fd).st_size
            self._map = mmap.mmap(memory_fd, size)
        finally:
            os.close(memory_fd)
        magic, version, slots, slot_size, error_slots = _HEADER_READ.unpack_from(self._map, 0)
        if magic != layout.MAGIC or version != layout.VERSION or slot_size != layout.SLOT_SIZE:
            self._map.close()
            raise RingClosed(f"unknown ring format {magic:#x} v{version}")
        if size < layout.ring_bytes(slots):
            self._map.close()
            raise RingClosed("ring memory smaller than its header says")
        # Counters through word views: one aligned store or load each (never torn).
        self._words = memoryview(self._map).cast("Q")
        self._halves = memoryview(self._map).cast("I")
        self.slots: int = slots
        self._mask: int = slots - 1
        self._error_slots = error_slots
        self._submit_fd = submit_fd
        self._complete_fd = complete_fd
        self._head = int(self._words[_HEAD])
        self._errors_seen = 0
        self._next_handle = 1
        self.spin_seconds = wait_spin_seconds()
        self.closed_reason = "the daemon closed this ring"
        """What a ``RingClosed`` says once the daemon closed the ring."""
        self.abandoned: Callable[[], bool] | None = None
        """Asked while a wait sleeps: true once the daemon is known gone (its link lost)."""
        self._closed = False
        self._fd_lock = threading.Lock()
        """Held to read ``complete``, to write ``submit`` and to close the descriptors: no
        thread reads or writes a number another thread's ``close()`` freed (a socket now)."""

    @classmethod
    def connect(cls, handoff: Path, ring_id: str, ticket: bytes, timeout: float = 5.0) -> Ring:
        """Take the offered ring from the daemon's handoff socket."""
        try:
            fds = _handoff.take(handoff, ring_id, ticket, 3, timeout)
        except _handoff.HandoffRefused as refused:
            raise RingClosed("the daemon refused the ring's ticket") from refused
        return cls(*fds)

    # Publishing ---------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """This side's mapping is closed (not: the daemon closed the ring)."""
        return self._closed

    @property
    def head(self) -> int:
        """The seq the next record gets."""
        return self._head

    def new_handle(self) -> int:
        handle, self._next_handle = self._next_handle, self._next_handle + 1
        return handle

    def bind(self, kind: layout.Kind, handle: int, object_id: str, timeout: float) -> int:
        return self._named(kind, 0, handle, object_id, b"", timeout)

    def copy(
        self,
        buffer: int,
        segment_id: str,
        fields: tuple[int, int, int],
        *,
        to_segment: bool,
        timeout: float,
    ) -> int:
        """Publish a COPY record (``fields``: segment offset, buffer offset, size); its seq."""
        flags = layout.NOTIFY | (layout.TO_SEGMENT if to_segment else 0)
        packed = layout.COPY_FIELDS.pack(*fields)
        return self._named(layout.Kind.COPY, flags, buffer, segment_id, packed, timeout)

    def _named(
        self,
        kind: layout.Kind,
        flags: int,
        handle: int,
        object_id: str,
        values: bytes,
        timeout: float,
    ) -> int:
        """Publish a record naming ``object_id``, with ``values`` in its scalar bytes."""
        raw = object_id.encode("ascii", "replace")
        if len(raw) > layout.MAX_ID_BYTES:
            why = f"{object_id[:32]!r}... is longer than any id the daemon gives"
            raise InvalidArgument(f"id {why}", field_violations=[FieldViolation("id", why)])
        slot = self._slot(timeout)
        layout.RECORD.pack_into(
            self._map, slot, self._head, kind, flags, handle, 0, 0, 0, *([0] * 16), values
        )
        self._map[slot + layout.ID_OFFSET] = len(raw)
        start = slot + layout.ID_OFFSET + 1
        self._map[start : start + len(raw)] = raw
        return self._publish()

    def unbind(self, handle: int, timeout: float) -> int:
        slot = self._slot(timeout)
        layout.RECORD.pack_into(
            self._map, slot, self._head, layout.Kind.UNBIND, 0, handle, 0, 0, 0, *([0] * 16), b""
        )
        return self._publish()

    def launch(
        self,
        session: int,
        operands: Sequence[int],
        results: Sequence[int],
        scalars: bytes,
        n_scalars: int,
        *,
        notify: bool,
        timeout: float,
    ) -> int:
        """Publish a launch record; its seq. ``scalars``: each value's bytes in 8-byte fields."""
        fixed = self.fixed_part(session, operands, results, n_scalars)
        values = scalars[:_SCALAR_BYTES].ljust(_SCALAR_BYTES, b"\0")
        slot = self._slot(timeout)
        self._map[slot + layout.SCALARS_OFFSET : slot + layout.ID_OFFSET] = values
        self._write(slot, fixed, notify)
        return self._publish()

    @staticmethod
    def fixed_part(
        session: int, operands: Sequence[int], results: Sequence[int], n_scalars: int
    ) -> bytes:
        """The part of a launch record that repeats from one launch to the next (no seq, no
        scalar values), for ``launch_fixed``."""
        handles = [*operands, *results]
        if len(handles) > layout.MAX_BUFFERS:
            why = f"a ring launch takes at most {layout.MAX_BUFFERS} buffers, not {len(handles)}"
            raise InvalidArgument(why, field_violations=[FieldViolation("operands", why)])
        handles += [0] * (layout.MAX_BUFFERS - len(handles))
        return layout.RECORD_FIXED.pack(
            layout.Kind.LAUNCH, 0, session, len(operands), len(results), n_scalars, *handles
        )

    def launch_fixed(
        self,
        fixed: bytes,
        scalars: struct.Struct,
        values: Sequence[object],
        notify: bool,
        timeout: float,
    ) -> int:
        """Publish a launch record from its ``fixed_part`` and its scalar values, packed by
        ``scalars`` (a struct of the record's 64 scalar bytes) straight into the slot; its seq.

        A value ``scalars`` cannot pack raises ``struct.error``, and nothing is published.
        Every launch comes here: ``_slot``, ``_write`` and ``_publish`` are written out inline.
        """
        if self._closed or self._halves[_CLOSED]:
            raise RingClosed(self.closed_reason)
        head = self._head
        words = self._words
        if head - words[_DONE] >= self.slots:
            self._await(lambda: self._head - self.done < self.slots, timeout, RingFull)
        slot = layout.HEADER_SIZE + (head & self._mask) * layout.SLOT_SIZE
        memory = self._map
        scalars.pack_into(memory, slot + layout.SCALARS_OFFSET, *values)
        words[slot >> 3] = head
        memory[slot + 8 : slot + layout.SCALARS_OFFSET] = fixed
        if notify:
            memory[slot + _FLAGS] = layout.NOTIFY
        self._head = head + 1
        words[_HEAD] = head + 1
        if self._halves[_DAEMON_WAITS]:
            self._kick()
        return head

    def _write(self, slot: int, fixed: bytes, notify: bool) -> None:
        """Write a record's seq and fixed part into its slot (free: the daemon took it)."""
        self._words[slot >> 3] = self._head
        self._map[slot + 8 : slot + layout.SCALARS_OFFSET] = fixed
        if notify:
            self._map[slot + _FLAGS] = layout.NOTIFY

    def _slot(self, timeout: float) -> int:
        """The offset of the next record's slot, once the daemon has taken what was there."""
        if self._closed or self._halves[_CLOSED]:
            raise RingClosed(self.closed_reason)
        # A slot is free once taken, but launches in flight are also bounded by the ring's
        # size, so done (not tail) is the window: one client cannot queue without end.
        head = self._head
        if head - self._words[_DONE] >= self.slots:
            self._await(lambda: self._head - self.done < self.slots, timeout, RingFull)
        return layout.HEADER_SIZE + (head & self._mask) * layout.SLOT_SIZE

    def _publish(self) -> int:
        seq = self._head
        self._head = seq + 1
        self._words[_HEAD] = seq + 1
        if self._halves[_DAEMON_WAITS]:
            self._kick()
        return seq

    def _kick(self) -> None:
        """Wake the daemon's side, which said it sleeps: under the lock ``close()`` takes, so
        never into a number another thread closed (the publisher may race a ``close()``)."""
        with self._fd_lock, contextlib.suppress(BlockingIOError):
            if not self._closed:
                os.eventfd_write(self._submit_fd, 1)

    # Waiting ------------------------------------------------------------------------

    @property
    def done(self) -> int:
        return int(self._words[_DONE])

    @property
    def taken(self) -> int:
        """Records the daemon took: its ``tail``, or ``done`` where that is ahead (a ring the
        device serves, whose ``tail`` moves only for what the CPU path took)."""
        return int(max(self._words[layout.TAIL_WORD], self._words[_DONE]))

    def flush(self, timeout: float) -> None:
        """Wait until the daemon has taken every record published (checked and enqueued)."""
        head = self._head
        self._await(lambda: self.taken >= head, timeout, DeadlineExceeded)

    def wait(self, seq: int, timeout: float) -> None:
        """Wait until record ``seq`` (and every one before it) finished or was refused."""
        if not self._closed and self._words[_DONE] > seq:
            return
        self._await(lambda: self.done > seq, timeout, DeadlineExceeded)

    def _await(self, ready: Callable[[], bool], timeout: float, error: type[Exception]) -> None:
        if self._closed:
            raise RingClosed("the ring was closed")
        try:
            self._await_open(ready, timeout, error)
        except ValueError:  # the mapping was closed under this wait
            raise RingClosed("the ring was closed") from None

    def wait_spin(self) -> float:
        """How long the next wait spins: ``spin_seconds``, or the daemon's published budget
        if less (read at every wait: the daemon changes it as clients come and go)."""
        published = int(self._halves[_WAIT_SPIN])
        if not published & _SPIN_SET:
            return self.spin_seconds
        if published & _SPIN_DEVICE:  # no engine thread to leave CPUs to: the daemon's word
            return (published & _SPIN_US) * 1e-6
        return min(self.spin_seconds, (published & _SPIN_US) * 1e-6)

    @property
    def device_served(self) -> bool:
        """Whether the daemon's device launcher serves this ring now."""
        return bool(self._halves[_WAIT_SPIN] & _SPIN_DEVICE)

    def _await_open(
        self, check: Callable[[], bool], timeout: float, error: type[Exception]
    ) -> None:
        if self.device_served:
            self._await_device(check, timeout, error)
            return
        deadline = time.monotonic() + timeout
        spin_until = time.monotonic() + self.wait_spin()
        while not check():
            if self._u32(layout.CLOSED):
                raise RingClosed(self.closed_reason)
            now = time.monotonic()
            if now >= deadline:
                raise error(f"the daemon did not get through the ring within {timeout:g} s")
            if now < spin_until:
                continue
            if self.abandoned is not None and self.abandoned():
                raise RingClosed("the daemon went away")
            if self.device_served:  # handed to the GPU while we waited (we were woken)
                self._await_device(check, deadline - now, error)
                return
            self._halves[layout.CLIENT_WAITS_HALF] = 1
            try:
                if not check():
                    # poll, not select: select refuses a descriptor numbered 1024 or more,
                    # which a process with many files open gets (one poller per wait: a
                    # poller may not be polled by two threads at once).
                    poller = select.poll()
                    poller.register(self._complete_fd, select.POLLIN)
                    if poller.poll(max(min(deadline - now, 0.05), 0.0) * 1000):
                        with self._fd_lock, contextlib.suppress(BlockingIOError):
                            if not self._closed:
                                os.eventfd_read(self._complete_fd)
            finally:
                self._halves[layout.CLIENT_WAITS_HALF] = 0

    def _await_device(
        self, check: Callable[[], bool], timeout: float, error: type[Exception]
    ) -> None:
        """A wait on a ring the GPU serves: spin yielding the CPU (the waiters share the CPUs
        with no engine thread), then nap (``complete`` is not written for what the GPU
        served); kick the daemon once for each record the GPU left to its CPU path, which
        sleeps until told."""
        now = time.monotonic()
        deadline = now + timeout
        spin_until = now + self.wait_spin()
        kicked = 0
        words, halves = self._words, self._halves
        while not check():
            left = int(words[_LEFT])
            if left > words[_DONE] and left != kicked:
                kicked = left
                self._kick()
            if halves[_CLOSED]:
                raise RingClosed(self.closed_reason)
            now = time.monotonic()
            if now >= deadline:
                raise error(f"the daemon did not get through the ring within {timeout:g} s")
            if now < spin_until:
                os.sched_yield()
                continue
            if self.abandoned is not None and self.abandoned():
                raise RingClosed("the daemon went away")
            time.sleep(max(min(deadline - now, DEVICE_NAP_SECONDS), 0.0))

    # Waiting on an event loop (accy.aio) -------------------------------------------------

    @property
    def complete_fd(self) -> int:
        """The ``complete`` eventfd, for an event loop to watch (``loop.add_reader``)."""
        return self._complete_fd

    def sleeping(self, asleep: bool) -> None:
        """Say whether a waiter sleeps on ``complete`` (the daemon then writes it as ``done``
        moves), as a blocking wait does around its poll."""
        if not self._closed:
            self._halves[layout.CLIENT_WAITS_HALF] = 1 if asleep else 0

    def woken(self) -> None:
        """Read ``complete`` once it is readable (it counts wakes; the count is not needed)."""
        with self._fd_lock, contextlib.suppress(BlockingIOError):
            if not self._closed:
                os.eventfd_read(self._complete_fd)

    @property
    def closed_by_daemon(self) -> bool:
        """Whether the daemon closed the ring (detached, stopping, or the ring was misused)."""
        return self._closed or bool(self._u32(layout.CLOSED))

    # Errors -----------------------------------------------------------------------------

    def has_errors(self) -> bool:
        """Whether the daemon wrote errors that ``errors()`` has not returned yet."""
        if self._closed:
            raise RingClosed("the ring was closed")
        return bool(self._words[_ERRORS] != self._errors_seen)

    def errors(self) -> list[RingError]:
        """Errors written since the last call (the oldest may be lost if more than fit)."""
        if self._closed:
            raise RingClosed("the ring was closed")
        written = int(self._words[_ERRORS])
        first = max(self._errors_seen, written - self._error_slots)
        found = []
        for index in range(first, written):
            at = layout.error_offset(index, self._error_slots)
            seq, reason, field, session, length = layout.ERROR_ENTRY.unpack_from(self._map, at)
            start = at + layout.ERROR_ENTRY.size
            message = self._map[start : start + min(length, layout.MESSAGE_BYTES)]
            found.append(
                RingError(
                    seq,
                    reason.rstrip(b"\0").decode("ascii", "replace"),
                    field.rstrip(b"\0").decode("utf-8", "replace"),
                    message.decode("utf-8", "replace"),
                    session.rstrip(b"\0").decode("ascii", "replace"),
                )
            )
        self._errors_seen = written
        return found

    def _u32(self, offset: int) -> int:
        return int(self._halves[offset >> 2])

    def close_in_child(self) -> None:
        """In a forked child: never write here again (the memory is the parent's ring), and
        unmap it here if nothing holds a view of it; takes no lock."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(BufferError, ValueError, OSError):
            self._unmap()

    def close(self) -> None:
        with self._fd_lock:
            if self._closed:
                return
            self._closed = True
            self._unmap()

    def _unmap(self) -> None:
        for fd in (self._submit_fd, self._complete_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._words.release()
        self._halves.release()
        self._map.close()
