"""What an ``AsyncClient`` makes on the daemon: ``AsyncSession``, its ``AsyncLaunch``es, and
``AsyncBuffer``.

Each builds its requests and refuses bad input with the blocking client's own
helpers (``accy._requests``, ``accy._scalars``), so the same mistake raises the same
error from either client. A launch goes through the link's ring where it has one
(``accy.aio._ring``), else as a unary ``Launch`` call; either way it is awaited on
the event loop, and cancelling the task that awaits it cancels the wait, not the work.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

import numpy as np

from accy import _chunks, _dtypes
from accy._chunks import Progress
from accy._connection import UNSET
from accy._dtypes import DTypeLike
from accy._models import PipelineInfo
from accy._requests import (
    freed_error,
    launch_request,
    read_plan,
    released_error,
    shaped_read,
    write_data,
)
from accy._scalars import check_scalars, pack_scalars
from accy._seam import LaunchRequest, Ticket
from accy.aio._link import AioLink
from accy.aio._ring import AioRing, ring_of
from accy.errors import AccyError
from accy.protocol.launch.v1 import launch_pb2 as pb

__all__ = ["AsyncBuffer", "AsyncLaunch", "AsyncSession"]


def _release_dropped(link: AioLink, session_id: str) -> None:
    """A session collected unreleased: release it soon on its loop."""

    async def release() -> None:
        if link.ring is not None:
            link.ring.forget(session_id)
        await link.call(link.stub.Release, pb.ReleaseRequest(session_id=session_id))

    link.later(release)


def _free_dropped(link: AioLink, buffer_id: str) -> None:
    """A buffer collected unfreed: free it soon on its loop."""

    async def free() -> None:
        if link.ring is not None:
            link.ring.forget(buffer_id)
        await link.call(link.stub.FreeBuffer, pb.FreeBufferRequest(buffer_id=buffer_id))

    link.later(free)


class AsyncSession:
    """A loaded pipeline with its own stream on the daemon: ``await launch(...)`` many times,
    then ``await release()`` (or use it as ``async with``). Made by ``AsyncClient.load``."""

    id: str
    device: int
    created: bool
    format: str
    info: PipelineInfo
    _link: AioLink
    _released: bool
    _net: weakref.finalize[Any, Any]
    """The safety net: a session collected unreleased is released in the background."""

    def __init__(self, *_: object, **__: object) -> None:
        raise TypeError("an AsyncSession is made by AsyncClient.load()")

    @classmethod
    def _made(cls, link: AioLink, response: pb.LoadPipelineResponse) -> AsyncSession:
        session = object.__new__(cls)
        session._link = link
        session._released = False
        session._net = weakref.finalize(session, _release_dropped, link, response.session_id)
        session._net.atexit = False  # at exit the daemon frees it all when the client goes
        session.id = response.session_id
        session.device = response.device
        session.created = response.created
        session.format = response.format
        session.info = PipelineInfo.from_proto(response.pipeline)
        return session

    def __repr__(self) -> str:
        state = " released" if self._released else ""
        info = self.info
        return (
            f"<accy.aio.AsyncSession {self.id} {info.target} v{info.version} {self.format}{state}>"
        )

    @property
    def closed(self) -> bool:
        return self._released

    def _id_on(self, link: object) -> str:
        """This session's id for a call; a released session raises as the blocking one does."""
        if self._released:
            raise released_error(self.id, self.info.target)
        return self.id

    async def allocate_intermediates(self, **scalars: float) -> int:
        """Allocate the session's scratch once for these scalars; returns its size in bytes."""
        request = pb.AllocateIntermediatesRequest(
            session_id=self._id_on(self._link),
            runtime_scalars=pack_scalars(self.info.runtime_scalars, scalars),
        )
        link = self._link
        response = await link.call(link.stub.AllocateIntermediates, request)
        return response.byte_size

    async def launch(
        self,
        operands: Sequence[AsyncBuffer | str] = (),
        results: Sequence[AsyncBuffer | str] = (),
        wait: bool = True,
        *,
        timeout: float | None = UNSET,
        **scalars: float,
    ) -> AsyncLaunch:
        """Enqueue the pipeline on this session's stream; with ``wait``, return once it finished.

        Scalars and buffers are checked before anything is sent, as by ``Session.launch``;
        the daemon's refusal raises here (through a ring, a refusal of a launch nobody
        waited for is raised by the session's next launch or wait, naming its record).
        Cancelling the awaiting task cancels the wait: the launch, once sent, still runs,
        and ``wait()`` (or the session's) finds it.
        """
        link = self._link
        if not link.ring_tried:
            check_scalars(self.info, scalars)  # a launch refused here opens no ring
        ring = await ring_of(link)
        request = LaunchRequest(self, operands, results, scalars, wait, timeout)
        if ring is None:
            response = await link.call(link.stub.Launch, launch_request(request, link), timeout)
            return AsyncLaunch._called(self, response)
        launch = AsyncLaunch._ringed(self, ring, await ring.launch(request))
        if wait:
            await launch.wait(timeout)
        return launch

    async def wait(self, timeout: float | None = UNSET) -> None:
        """Wait for every launch of this session so far."""
        link = self._link
        session_id = self._id_on(link)
        if link.ring is not None:
            await link.ring.wait(None, session_id, timeout)
            return
        await link.call(link.stub.WaitLaunch, pb.WaitLaunchRequest(session_id=session_id), timeout)

    async def release(self) -> None:
        """Let this load go (idempotent); the daemon frees the session once its work ended."""
        if self._released:
            return
        self._released = True
        self._net.detach()
        link = self._link
        if link.closed or link.lost is not None:
            return  # the daemon freed it with the client
        if link.ring is not None:
            link.ring.forget(self.id)  # before the call, which the daemon takes after it
        await link.call(link.stub.Release, pb.ReleaseRequest(session_id=self.id))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release()


class AsyncLaunch:
    """One launch of an ``AsyncSession``: done if it was waited for, else ``await wait()``."""

    __slots__ = (
        "_ring",
        "_ticket",
        "completed",
        "elapsed_seconds",
        "enqueue_seconds",
        "id",
        "record",
        "session",
    )

    session: AsyncSession
    completed: bool
    id: str | None
    """The daemon's id of a launch made by a call (``lau_...``); ``None`` through a ring."""
    record: int | None
    """The ring record that carried the launch (the daemon's errors name it); ``None`` for a
    launch made by a call."""
    enqueue_seconds: float | None
    elapsed_seconds: float | None
    _ring: AioRing | None
    _ticket: Ticket | None

    def __init__(self, *_: object, **__: object) -> None:
        raise TypeError("an AsyncLaunch is made by AsyncSession.launch()")

    @classmethod
    def _called(cls, session: AsyncSession, response: pb.LaunchResponse) -> AsyncLaunch:
        launch = object.__new__(cls)
        launch.session, launch._ring, launch._ticket = session, None, None
        launch.id, launch.record = response.launch_id, None
        launch.completed = response.completed
        launch.enqueue_seconds = response.enqueue_seconds
        launch.elapsed_seconds = response.elapsed_seconds
        return launch

    @classmethod
    def _ringed(cls, session: AsyncSession, ring: AioRing, ticket: Ticket) -> AsyncLaunch:
        launch = object.__new__(cls)
        launch.session, launch._ring, launch._ticket = session, ring, ticket
        launch.id, launch.record = None, ticket.record
        launch.completed = False
        launch.enqueue_seconds = launch.elapsed_seconds = None
        return launch

    def __repr__(self) -> str:
        what = f"ring record {self.record}" if self.record is not None else self.id
        state = "completed" if self.completed else "enqueued"
        return f"<accy.aio.AsyncLaunch {what} of {self.session.id} {state}>"

    async def wait(self, timeout: float | None = UNSET) -> AsyncLaunch:
        """Until this launch finished on the device; returns ``self``. A refusal raises why."""
        if self.completed:
            return self
        if self._ring is not None:
            await self._ring.wait(self._ticket, None, timeout)
        else:
            link = self.session._link
            request = pb.WaitLaunchRequest(session_id=self.session.id, launch_id=self.id or "")
            await link.call(link.stub.WaitLaunch, request, timeout)
        self.completed = True
        return self


class AsyncBuffer:
    """A device buffer owned by an ``AsyncClient``: ``await write``/``read`` in streamed chunks,
    then ``await free()`` (or use it as ``async with``). Made by ``AsyncClient.buffer`` and
    ``AsyncClient.empty``."""

    id: str
    nbytes: int
    capacity: int
    dtype: np.dtype[Any] | None
    device: int
    shape: tuple[int, ...] | None
    _link: AioLink
    _freed: bool
    _net: weakref.finalize[Any, Any]
    """The safety net: a buffer collected unfreed is freed in the background."""

    def __init__(self, *_: object, **__: object) -> None:
        raise TypeError("an AsyncBuffer is made by AsyncClient.buffer() or AsyncClient.empty()")

    @classmethod
    def _made(
        cls,
        link: AioLink,
        response: pb.AllocateBufferResponse,
        nbytes: int,
        dtype: np.dtype[Any] | None,
        shape: tuple[int, ...] | None,
    ) -> AsyncBuffer:
        buffer = object.__new__(cls)
        buffer._link = link
        buffer._freed = False
        buffer._net = weakref.finalize(buffer, _free_dropped, link, response.buffer_id)
        buffer._net.atexit = False
        buffer.id = response.buffer_id
        buffer.nbytes = nbytes
        buffer.capacity = response.byte_size
        buffer.dtype = dtype
        buffer.device = response.device
        buffer.shape = shape
        return buffer

    def __repr__(self) -> str:
        state = " freed" if self._freed else ""
        kind = _dtypes.name_of(self.dtype)
        return f"<accy.aio.AsyncBuffer {self.id} {self.nbytes} bytes {kind}{state}>"

    @property
    def closed(self) -> bool:
        return self._freed

    @property
    def size(self) -> int:
        """Elements of ``dtype`` the buffer holds (bytes when it has no dtype)."""
        return self.nbytes // (self.dtype.itemsize if self.dtype is not None else 1)

    def _buffer_id_on(self, link: object) -> str:
        """This buffer's id for a call (a launch names it); a freed buffer raises."""
        if self._freed:
            raise freed_error(self.id)
        return self.id

    async def write(
        self,
        array: np.ndarray[Any, Any] | Sequence[Any],
        offset: int = 0,
        *,
        chunk_size: int | None = None,
        progress: Progress | None = None,
        timeout: float | None = UNSET,
    ) -> int:
        """Upload ``array`` at byte ``offset`` in chunks; returns the bytes written (checked as
        ``Buffer.write`` checks)."""
        raw = write_data(self.id, self.dtype, self.nbytes, array, offset)
        self._buffer_id_on(self._link)
        link = self._link
        size = _chunks.check_chunk_size(chunk_size or link.chunk_size)
        chunks = _chunks.write_chunks(self.id, raw, offset, size, progress)
        answer = await link.stream_in(link.stub.WriteBuffer, chunks, link.timeout_of(timeout))
        return int(answer.bytes_written)

    async def read(
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
        ``offset``; with ``out`` fill and return it (as ``Buffer.read``)."""
        plan = read_plan(self.id, self.nbytes, self.dtype, dtype, count, offset, out)
        self._buffer_id_on(self._link)
        if plan.size == 0:
            return np.empty(0, dtype=plan.kind) if out is None else out
        link = self._link
        chunk = _chunks.check_chunk_size(chunk_size or link.chunk_size)
        request = pb.ReadBufferRequest(
            buffer_id=self.id, offset=offset, size=plan.size, chunk_size=chunk
        )
        gathered = _chunks.Gathered(offset, plan.size, progress)
        await link.stream_out(
            link.stub.ReadBuffer, request, link.timeout_of(timeout), gathered.take
        )
        got = gathered.result()
        if out is not None:
            out.reshape(-1).view(np.uint8)[:] = got
            return out
        return shaped_read(got, plan, offset, self.dtype, self.shape, self.size)

    async def free(self) -> None:
        """Free the buffer on the daemon; later calls do nothing."""
        if self._freed:
            return
        self._freed = True
        self._net.detach()
        link = self._link
        if link.closed or link.lost is not None:
            return  # the daemon freed it with the client
        if link.ring is not None:
            link.ring.forget(self.id)  # before the call, which the daemon takes after it
        try:
            await link.call(link.stub.FreeBuffer, pb.FreeBufferRequest(buffer_id=self.id))
        except AccyError:
            if link.lost is None:
                raise

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.free()
