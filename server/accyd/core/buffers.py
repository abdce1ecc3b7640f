"""Device buffers owned by one client, their hazards across streams, and streamed transfers.

Every buffer remembers the mark of its last write and the marks of launches
that read it since. Work that reads it first waits for the last write; work
that writes or frees it waits for the readers too (DESIGN.md, "Concurrency").
Marks and these lists change only under the daemon's lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

from accyd.backends.base import Backend, DeviceBuffer, Exported, Stream
from accyd.catalog.dtypes import DType
from accyd.core.marks import Mark
from accyd.core.tickets import EngineUser, TicketEntry
from accyd.core.waits import call_when_done, until_done
from accyd.errors import InvalidRequest, NotFound

__all__ = ["BufferRecord", "Transfer"]


@dataclass(eq=False, slots=True)
class BufferRecord:
    """One client's device buffer: the backend's handle, its element type, its hazards."""

    id: str
    device: int
    buffer: DeviceBuffer
    backend: Backend
    """The backend that made ``buffer`` and frees it (a replaced device's is retired)."""
    dtype: DType | None = None
    charged: int = 0
    """The memory charged for it: its size, or more where the backend rounds it up."""
    descriptors: int = 0
    """The descriptors charged for it (an exportable buffer's memory has one or two)."""
    last_write: Mark | None = None
    readers: list[Mark] = field(default_factory=list)
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    """Held by each chunk of a transfer and by the free, so a free never races a copy."""
    ticketed: dict[TicketEntry, bool] = field(default_factory=dict, repr=False)
    """Prepared launches with a live engine ticket naming it, and whether each writes it."""
    engine: dict[EngineUser, bool] = field(default_factory=dict, repr=False)
    """Sessions whose engine launches may have used it since Python last absorbed them
    (``core/tickets.py``), and whether they write it."""

    def __post_init__(self) -> None:
        self.charged = self.charged or self.buffer.byte_size

    @property
    def byte_size(self) -> int:
        return self.buffer.byte_size

    def read_hazards(self) -> list[Mark]:
        return [] if self.last_write is None else [self.last_write]

    def write_hazards(self) -> list[Mark]:
        return [*self.read_hazards(), *self.readers]

    def note_read(self, mark: Mark) -> None:
        """A read recorded by ``mark``; it supersedes older reads on the same stream."""
        readers = self.readers
        if len(readers) == 1 and readers[0].stream_id == mark.stream_id:  # the usual case
            old, readers[0] = readers[0], mark.retain()
            old.release()
            return
        for old in [m for m in readers if m.stream_id == mark.stream_id]:
            readers.remove(old)
            old.release()
        readers.append(mark.retain())

    def note_write(self, mark: Mark) -> None:
        """A write recorded by ``mark``: it supersedes every earlier use."""
        last, readers = self.last_write, self.readers
        self.last_write = mark.retain()
        if readers:
            self.readers = []
            for old in readers:
                old.release()
        if last is not None:
            last.release()

    def take_marks(self) -> list[Mark]:
        """Every mark held, handed to the caller (who waits and releases them)."""
        marks = self.write_hazards()
        self.last_write = None
        self.readers = []
        return marks


class Transfer:
    """One streamed write or read of a buffer, in order on its client's transfer stream.

    Made by the daemon after the stream was ordered after the buffer's hazards.
    ``write`` and ``read`` block until the copy is done; ``finish`` records the
    write for later hazards. A buffer freed meanwhile is ``NotFound``.

    ``waits`` holds the hazards not yet over when it was made (references of its
    own): a door awaits them first (``settled`` on the event loop, ``when_ready`` by
    callback), so a copy holds a thread only while its bytes move, never while the
    device still runs the buffer's earlier work.
    """

    def __init__(
        self,
        backend: Backend,
        record: BufferRecord,
        stream: Stream,
        lock: threading.RLock,
        *,
        writing: bool,
        waits: list[Mark] | None = None,
        lost: Callable[[], bool] = lambda: False,
    ) -> None:
        self.backend = backend
        self.record = record
        self.stream = stream
        self.writing = writing
        self.bytes_moved = 0
        self._lock = lock
        self._waits = waits or []
        self._lost = lost

    def take_waits(self) -> list[Mark]:
        """The hazards it was ordered after that were not over, handed to the caller (who
        releases them); empty the second time."""
        waits, self._waits = self._waits, []
        return waits

    async def settled(self) -> None:
        """Await, on the event loop, the buffer's work this transfer was ordered after (or a
        lost device); its copies then hold a device-work thread only while bytes move."""
        waits = self.take_waits()
        try:
            await until_done(waits, self._lost)
        finally:
            for mark in waits:
                mark.release()

    def when_ready(self, ready: Callable[[], None]) -> None:
        """Call ``ready`` (from any thread, once) when ``settled`` would return: the same
        wait for a caller with no event loop, holding no thread meanwhile."""
        waits = self.take_waits()

        def then() -> None:
            for mark in waits:
                mark.release()
            ready()

        call_when_done(waits, then, self._lost)

    @property
    def byte_size(self) -> int:
        return self.record.byte_size

    def check_range(self, offset: int, size: int, field: str) -> None:
        if offset < 0 or size < 0 or offset + size > self.record.byte_size:
            raise InvalidRequest(
                f"bytes {offset}..{offset + size} are outside buffer {self.record.id} "
                f"of {self.record.byte_size} bytes",
                field=field,
            )

    def _live(self) -> BufferRecord:
        if self.record.closed:
            raise NotFound(f"buffer {self.record.id} was freed", field="buffer_id")
        return self.record

    def write(self, offset: int, data: bytes | memoryview) -> None:
        """Copy ``data`` in at ``offset``; blocks until done (call off the event loop)."""
        self.check_range(offset, len(data), "offset")
        with self.record.lock:
            self.backend.write(self._live().buffer, offset, data, self.stream)
        self.bytes_moved += len(data)

    def read(self, offset: int, size: int) -> bytes:
        """Copy ``size`` bytes out from ``offset``; blocks until done (call off the event loop)."""
        self.check_range(offset, size, "size")
        with self.record.lock:
            data = self.backend.read(self._live().buffer, offset, size, self.stream)
        self.bytes_moved += size
        return data

    def read_into(self, offset: int, out: bytearray | memoryview) -> None:
        """Copy ``len(out)`` bytes out from ``offset`` into ``out``; blocks (off the event loop)."""
        size = memoryview(out).nbytes
        self.check_range(offset, size, "size")
        with self.record.lock:
            self.backend.read_into(self._live().buffer, offset, out, self.stream)
        self.bytes_moved += size

    def export(self) -> Exported:
        """The buffer's memory for another process, once the work queued on it before is
        over; blocks (off the event loop). The descriptor is the caller's to close."""
        with self.record.lock:
            buffer = self._live().buffer
            self.backend.synchronize(self.stream)
            return self.backend.export_buffer(buffer)

    def finish(self) -> None:
        """Record a write so later work on other streams waits for it; idempotent. Lets go
        of the hazards nobody took."""
        for mark in self.take_waits():
            mark.release()
        if not self.writing or self.bytes_moved == 0:
            return
        self.writing = False
        with self._lock:
            if self.record.closed:
                return
            mark = Mark(self.backend, self.stream)
            self.record.note_write(mark)
            mark.release()

    def __enter__(self) -> Transfer:
        return self

    def __exit__(
        self, exc: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.finish()
