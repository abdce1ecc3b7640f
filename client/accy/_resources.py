"""What a client owns on the daemon, as objects: the ``Resource`` base and ``Buffer``.

Each resource is made by its owner only (a buffer by ``Client.buffer`` or
``Client.empty``), closes idempotently, and carries a safety net: one dropped
without being closed is freed in the background once Python collects it.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import Any, Self

import numpy as np

from accy import _chunks, _dtypes
from accy._chunks import Progress
from accy._connection import UNSET
from accy._control import Allocated, Control
from accy._dtypes import DTypeLike
from accy._export import ExportedBuffer, map_export
from accy._link import Link, device_lost, device_replaced
from accy._requests import freed_error, read_plan, shaped_read, write_data
from accy._seam import ReadRequest, WriteRequest
from accy._target import unix_socket_of
from accy.errors import (
    AccyError,
    BufferLost,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
)

__all__ = ["Buffer", "Resource", "allocate", "new_buffer", "operand_arrays"]


class Resource:
    """Idempotent, thread-safe ``close()`` and context-manager support.

    ``_arm`` sets the safety net: ``dropped`` runs (without the object) if the
    object is collected while open; ``close()`` disarms it and runs ``_close``.
    """

    _finalizer: weakref.finalize[Any, Any] | None = None

    def _arm(self, dropped: Callable[..., object], *args: object) -> None:
        self._finalizer = weakref.finalize(self, dropped, *args)
        self._finalizer.atexit = False  # at exit the daemon frees it all when we detach

    def _close(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Free what this object holds on the daemon; later calls do nothing."""
        finalizer = self._finalizer
        if finalizer is None or finalizer.detach() is None:
            return  # closed already (or by another thread right now)
        self._close()

    @property
    def closed(self) -> bool:
        return self._finalizer is None or not self._finalizer.alive

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _free_dropped(control: Control, link: Link, buffer_id: str) -> None:
    """The safety net of a buffer collected unfreed: free it in the background."""
    if control.conn.closed or link.lost is not None:
        return
    link.transport.forget(buffer_id)
    control.free_later(buffer_id, link)


def allocate(
    control: Control,
    nbytes: int,
    dtype: np.dtype[Any] | None,
    device: int | None,
    *,
    exportable: bool = False,
) -> Buffer:
    """A new buffer of ``nbytes`` bytes on the daemon (for ``Client.buffer`` and ``empty``)."""
    allocated, link = control.allocate(nbytes, dtype, device, exportable)
    return new_buffer(control, link, allocated, nbytes, dtype, exportable=exportable)


def new_buffer(
    control: Control,
    link: Link,
    allocated: Allocated,
    nbytes: int,
    dtype: np.dtype[Any] | None,
    *,
    exportable: bool = False,
) -> Buffer:
    """The ``Buffer`` for an allocation the daemon made on ``link`` (for ``Client`` only)."""
    buffer = object.__new__(Buffer)
    buffer._control = control
    buffer._link = link
    buffer.id = allocated.buffer_id
    buffer.nbytes = nbytes
    buffer.capacity = allocated.byte_size
    buffer.dtype = dtype
    buffer.device = allocated.device
    buffer.exportable = exportable
    buffer.shape = None
    buffer._gone = None
    link.buffers.add(buffer)
    buffer._arm(_free_dropped, control, link, buffer.id)
    return buffer


class Buffer(Resource):
    """A device buffer owned by this client: write and read in streamed chunks, then free.

    A buffer lives on one device of one daemon instance: once the client lost it
    (the daemon restarted, or a fault took its device), ``lost`` is true and
    every use raises ``BufferLost``. Buffers are made by ``Client.buffer`` and
    ``Client.empty``.
    """

    id: str
    nbytes: int
    capacity: int
    dtype: np.dtype[Any] | None
    device: int
    exportable: bool
    """Made with ``exportable=True``: ``export`` can map it."""
    shape: tuple[int, ...] | None
    """The shape of the array it was made from (or given to ``Client.empty``): a whole
    ``read()`` returns an array of this shape."""
    _control: Control
    _link: Link
    _gone: tuple[str, str | None] | None
    """Why and in whose session its device was lost, when only the device was."""

    def __init__(self, *_: object, **__: object) -> None:
        raise TypeError("a Buffer is made by Client.buffer() or Client.empty()")

    def __repr__(self) -> str:
        dtype = _dtypes.name_of(self.dtype)
        state = " freed" if self.closed else " lost" if self.lost else ""
        return f"<accy.Buffer {self.id} {self.nbytes} bytes {dtype}{state}>"

    @property
    def lost(self) -> bool:
        """Whether the daemon or device that held this buffer is gone (its data with it)."""
        return self._link.lost is not None or self._gone is not None

    @property
    def size(self) -> int:
        """Elements of ``dtype`` the buffer holds (bytes when it has no dtype)."""
        return self.nbytes // (self.dtype.itemsize if self.dtype is not None else 1)

    def _buffer_id_on(self, link: Link) -> str:
        """This buffer's id for a call on ``link``; ``BufferLost`` if the buffer is not there
        (the transport's hook: ``accy._seam.ids_of``)."""
        finalizer = self._finalizer  # the usual case first, in one test: every launch asks
        if (
            self._link is link
            and link.lost is None
            and self._gone is None
            and finalizer is not None
            and finalizer.alive
        ):
            return self.id
        if self.closed:
            raise freed_error(self.id)
        mine = self._link
        if mine.lost is not None:
            raise BufferLost(self.id, mine.lost, session=mine.fault_session)
        if self._gone is not None:
            raise BufferLost(self.id, self._gone[0], session=self._gone[1])
        if mine is not link and link.lost is None:
            raise BufferLost(self.id, "the client attached again", session=None)
        return self.id

    @contextlib.contextmanager
    def _using(self) -> Iterator[Link]:
        """The link to transfer on; a failure because that link went is ``BufferLost``."""
        link = self._link
        self._buffer_id_on(link)
        try:
            yield link
        except AccyError as error:
            if device_replaced(error, self.device):
                raise self._lose_device(error) from error
            if link.lost is None or device_lost(error):
                raise
            raise BufferLost(self.id, link.lost, session=link.fault_session) from error

    def _lose_device(self, error: AccyError) -> BufferLost:
        """Note that ``error`` (``device_replaced``) took this buffer's device; the error."""
        session = error.metadata.get("session")
        self._gone = (f"a fault took device {self.device}", session)
        self._link.transport.forget(self.id)  # records kept may name it
        return BufferLost(self.id, self._gone[0], session=session)

    def write(
        self,
        array: np.ndarray[Any, Any] | Sequence[Any],
        offset: int = 0,
        *,
        chunk_size: int | None = None,
        progress: Progress | None = None,
        timeout: float | None = UNSET,
    ) -> int:
        """Upload ``array`` at byte ``offset`` in chunks; returns the bytes written.

        An ndarray must have the buffer's dtype (no silent conversion); a plain
        sequence is converted to it.
        """
        raw = write_data(self.id, self.dtype, self.nbytes, array, offset)
        conn = self._control.conn
        size = _chunks.check_chunk_size(chunk_size or conn.chunk_size)
        request = WriteRequest(
            self.id, self.device, raw, offset, conn.timeout_of(timeout), size, progress
        )
        with self._using() as link:
            return link.transport.write(request)

    def read(
        self,
        dtype: DTypeLike | None = None,
        count: int | None = None,
        *,
        offset: int = 0,
        out: np.ndarray[Any, Any] | None = None,
        chunk_size: int | None = None,
        progress: Progress | None = None,
        timeout: float | None = UNSET,
    ) -> np.ndarray[Any, Any]:
        """Download ``count`` elements (default: to the end, or ``out``'s size) from byte
        ``offset``, in chunks; with ``out`` (a writable C-contiguous array) fill and return it."""
        plan = read_plan(self.id, self.nbytes, self.dtype, dtype, count, offset, out)
        size = plan.size
        self._buffer_id_on(self._link)
        if size == 0:
            return np.empty(0, dtype=plan.kind) if out is None else out
        conn = self._control.conn
        chunk = _chunks.check_chunk_size(chunk_size or conn.chunk_size)
        request = ReadRequest(
            self.id, self.device, offset, size, out, conn.timeout_of(timeout), chunk, progress
        )
        with self._using() as link:
            got = link.transport.read(request)
        if out is not None:
            return out
        return shaped_read(got, plan, offset, self.dtype, self.shape, self.size)

    def export(self, timeout: float | None = UNSET) -> ExportedBuffer:
        """This buffer's memory mapped in this process, with no copy, once the daemon's work
        queued on it so far is over: a CUDA buffer for ``cupy.from_dlpack`` or
        ``torch.from_dlpack`` (needs cuda-python here), a host one for ``numpy()``.

        The buffer must have been made with ``exportable=True``, by a daemon on this host (a
        ``unix:`` target). See ``ExportedBuffer`` for what is ordered with what."""
        if not self.exportable:
            why = (
                f"buffer {self.id} was not allocated exportable: make it with exportable=True "
                "(Client.buffer or Client.empty) to export it"
            )
            raise FailedPrecondition(
                why, reason="NOT_EXPORTABLE", field_violations=[FieldViolation("buffer_id", why)]
            )
        target = self._control.conn.target
        socket_path = unix_socket_of(target)
        if socket_path is None:
            raise FailedPrecondition(
                "exporting a buffer needs a daemon on this host (a unix: target), not " + target,
                reason="EXPORT_UNAVAILABLE",
            )
        kind = self.dtype if self.dtype is not None else np.dtype(np.uint8)
        with self._using() as link:
            offer = self._control.export_offer(self._buffer_id_on(link), link, timeout)
        return map_export(offer, socket_path, self.id, kind)

    def free(self) -> None:
        """Free the buffer on the daemon; later calls, and calls on a lost buffer, do nothing."""
        self.close()

    def _close(self) -> None:
        link = self._link
        link.buffers.discard(self)
        if self._control.conn.closed or link.lost is not None:
            return
        link.transport.forget(self.id)  # before the call, which the daemon takes after it
        self._control.free(self.id, link)


def operand_arrays(
    values: Sequence[object], names: Sequence[str], target: str
) -> list[np.ndarray[Any, Any]]:
    """``Client.run``'s operands as arrays; ``InvalidArgument`` for one that holds no numbers
    (a Buffer, a mapping), saying what to pass instead."""
    arrays = [np.asarray(value) for value in values]
    for index, (value, array) in enumerate(zip(values, arrays, strict=True)):
        if array.dtype == object:
            why = _not_an_array(value, target)
            name = names[index] if index < len(names) else f"#{index}"
            raise InvalidArgument(
                f"operand {name!r} {why}",
                field_violations=[FieldViolation(f"operands[{index}]", why)],
            )
    return arrays


def _not_an_array(value: object, target: str) -> str:
    """Why ``value`` is no operand of ``Client.run``, and what to pass instead."""
    if isinstance(value, Buffer):
        return (
            f"is a Buffer ({value.id}): run takes arrays and sends their data in the call; "
            f"pass an array (buffer.read()), or launch on the buffer with "
            f"client.load({target!r}).launch(operands=[...], results=[...])"
        )
    return (
        f"is a {type(value).__name__}, not an array of numbers: run takes one numpy array "
        "(or list of numbers) per operand, in order, and scalars by name (n=..., a=...)"
    )
