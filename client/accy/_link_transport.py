"""Choosing a link's transport, once: from the target, ``ACCY_RING`` and ``ACCY_SHM``.

``open_transport`` gives each link (attachment) its ``LinkTransport``: launches
through the shared ring on a Unix socket, through a ring over a ``RingStream``
call on TCP (or with ``ACCY_RING=stream``), or as unary calls with
``ACCY_RING=0``; buffer bytes through shared memory on a Unix socket unless
``ACCY_SHM=0`` or ``Client(shared_memory=False)``, else in streamed calls.

A ring is opened by the link's first launch (or first shared-memory copy), so a
client that never launches opens none; one the daemon refuses falls back to the
next way (shared ring, then ring stream, then unary calls), once for the link.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from accy._connection import Connection
from accy._link import Link
from accy._ring_path import RingLaunches, open_ring, open_stream_ring
from accy._scalars import check_scalars
from accy._seam import (
    BufferRef,
    ForgetFn,
    LaunchFn,
    LaunchOwner,
    ReadFn,
    Ticket,
    WaitFn,
    WriteFn,
)
from accy._shm import SharedBytes, SharedPool, no_shared_memory, shm_wanted
from accy._target import unix_socket_of
from accy._unary import StreamedBytes, UnaryLaunches
from accy.protocol import ring as layout

__all__ = ["STREAM", "LinkTransport", "open_transport", "shared_array", "shared_pool"]

STREAM = "stream"
"""``ACCY_RING=stream``: launch through a ring over a stream even on a local socket."""


class Launches(Protocol):
    """One way a link's launches go (``RingLaunches``, ``UnaryLaunches``, ``_PendingRing``)."""

    path: str
    copies: bool

    def launch(
        self,
        owner: LaunchOwner,
        operands: Sequence[BufferRef],
        results: Sequence[BufferRef],
        scalars: Mapping[str, object],
        wait: bool,
        timeout: Any,
    ) -> Ticket: ...

    def wait(
        self, ticket: Ticket | None, session_id: str | None, timeout: float | None
    ) -> None: ...

    def forget(self, object_id: str) -> None: ...

    def copy(
        self,
        segment_id: str,
        segment_offset: int,
        buffer_id: str,
        buffer_offset: int,
        size: int,
        *,
        to_buffer: bool,
        timeout: float | None,
    ) -> int: ...

    def close(self, drain: float = 0.0) -> None: ...


class LinkTransport:
    """A link's ``Transport``: its launches and its bytes, each chosen once.

    ``launch``, ``wait`` and ``forget`` are the current launches' own bound methods
    (so a launch passes through no frame of this class); ``write`` and ``read`` the bytes'.
    """

    launch: LaunchFn
    wait: WaitFn
    forget: ForgetFn
    write: WriteFn
    read: ReadFn

    def __init__(
        self,
        conn: Connection,
        link: Link,
        launches: Launches,
        streamed: StreamedBytes,
        pool: SharedPool | None,
    ) -> None:
        self._conn = conn
        self._link = link
        self.launches = launches
        self.launch = launches.launch
        self.wait = launches.wait
        self.forget = launches.forget
        self.bytes: SharedBytes | StreamedBytes = streamed
        if pool is not None:
            self.bytes = SharedBytes(pool, self, streamed)
        self.write = self.bytes.write
        self.read = self.bytes.read

    @property
    def path(self) -> str:
        return self.launches.path

    def use(self, launches: Launches) -> None:
        """From now on, launch through ``launches`` (the ring that opened, or calls)."""
        self.launch = launches.launch
        self.wait = launches.wait
        self.forget = launches.forget
        self.launches = launches

    def copy(
        self,
        segment_id: str,
        segment_offset: int,
        buffer_id: str,
        buffer_offset: int,
        size: int,
        *,
        to_buffer: bool,
        timeout: float | None,
    ) -> int:
        """A shared-memory copy: a COPY record on a shared ring (in its order with the
        launches, and no call), else a ``CopySegment`` call."""
        return self.launches.copy(
            segment_id,
            segment_offset,
            buffer_id,
            buffer_offset,
            size,
            to_buffer=to_buffer,
            timeout=timeout,
        )

    def close(self, drain: float = 0.0) -> None:
        self.launches.close(drain)
        self.bytes.close()

    def abandon(self) -> None:
        """In a forked child: let go of everything the parent's process owns, writing nothing."""
        launches = self.launches
        if isinstance(launches, RingLaunches):
            launches.abandon()
        self.use(_Forked(self._conn))


class _PendingRing:
    """A link's launches before its first: that one opens the ring (or finds none) first."""

    path = "pending"
    copies = False

    def __init__(
        self, conn: Connection, link: Link, transport: LinkTransport, ways: tuple[str, ...]
    ) -> None:
        self._conn = conn
        self._link = link
        self._transport = transport
        self._ways = ways
        self._lock = threading.Lock()

    def launch(
        self,
        owner: LaunchOwner,
        operands: Sequence[BufferRef],
        results: Sequence[BufferRef],
        scalars: Mapping[str, object],
        wait: bool,
        timeout: Any,
    ) -> Ticket:
        check_scalars(owner.info, scalars)  # a launch refused here opens nothing
        opened = self._opened(timeout)
        return opened.launch(owner, operands, results, scalars, wait, timeout)

    def wait(self, ticket: Ticket | None, session_id: str | None, timeout: float | None) -> None:
        """Nothing was launched on this link yet: nothing to wait for."""

    def forget(self, object_id: str) -> None:
        """Nothing is bound yet."""

    def copy(
        self,
        segment_id: str,
        segment_offset: int,
        buffer_id: str,
        buffer_offset: int,
        size: int,
        *,
        to_buffer: bool,
        timeout: float | None,
    ) -> int:
        opened = self._opened(timeout)
        return opened.copy(
            segment_id,
            segment_offset,
            buffer_id,
            buffer_offset,
            size,
            to_buffer=to_buffer,
            timeout=timeout,
        )

    def close(self, drain: float = 0.0) -> None:
        """Nothing was opened."""

    def _opened(self, timeout: Any) -> Launches:
        """The launches the link uses from now on: the first ring that opens, else calls."""
        conn, link, transport = self._conn, self._link, self._transport
        with self._lock:
            if transport.launches is not self:  # another thread opened it meanwhile
                return transport.launches
            left = conn.timeout_of(timeout)
            found: Launches | None = None
            for way in self._ways:
                if way == "ring":
                    socket_path = unix_socket_of(conn.target)
                    ring = None if socket_path is None else open_ring(conn, link, socket_path, left)
                    if ring is not None:
                        found = RingLaunches(conn, link, ring, None)
                else:
                    stream = open_stream_ring(conn, link, left)
                    if stream is not None:
                        found = RingLaunches(conn, link, stream.ring, stream)
                if found is not None:
                    break
            transport.use(found or UnaryLaunches(conn, link))
            return transport.launches


class _Forked:
    """What a forked child's link launches with: nothing. Its client refuses every call
    (``Connection.check_open``), and the parent's ring is not the child's to write."""

    path = "forked"
    copies = False

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def launch(
        self,
        owner: LaunchOwner,
        operands: Sequence[BufferRef],
        results: Sequence[BufferRef],
        scalars: Mapping[str, object],
        wait: bool,
        timeout: Any,
    ) -> Ticket:
        raise self._conn.closed_error()

    def wait(self, ticket: Ticket | None, session_id: str | None, timeout: float | None) -> None:
        raise self._conn.closed_error()

    def forget(self, object_id: str) -> None:
        """Nothing: a finalizer in the child must not unbind the parent's handles."""

    def copy(
        self,
        segment_id: str,
        segment_offset: int,
        buffer_id: str,
        buffer_offset: int,
        size: int,
        *,
        to_buffer: bool,
        timeout: float | None,
    ) -> int:
        raise self._conn.closed_error()

    def close(self, drain: float = 0.0) -> None:
        """Nothing to close in the child."""


def ways_wanted(target: str) -> tuple[str, ...]:
    """The rings to try for launches, in order (none: unary calls), by ``ACCY_RING``."""
    wanted = os.environ.get(layout.RING_ENV, "1")
    if wanted == "0":
        return ()
    if wanted == STREAM or unix_socket_of(target) is None:
        return ("ring-stream",)
    return ("ring", "ring-stream")


def open_transport(conn: Connection, link: Link) -> LinkTransport:
    """The transport of a new link, chosen now (rings are opened at its first launch)."""
    streamed = StreamedBytes(conn, link)
    socket_path = shm_wanted(conn)
    pool = None if socket_path is None else SharedPool(conn, link, socket_path)
    transport = LinkTransport(conn, link, UnaryLaunches(conn, link), streamed, pool)
    ways = ways_wanted(conn.target)
    if ways:
        transport.use(_PendingRing(conn, link, transport, ways))
    return transport


def shared_pool(link: Link) -> SharedPool | None:
    """The segments ``link`` shares with its daemon, where its bytes go through shared memory
    (for benchmarks and tests that look inside)."""
    transport = link.transport
    shared = transport.bytes if isinstance(transport, LinkTransport) else None
    return shared.pool if isinstance(shared, SharedBytes) else None


def shared_array(
    link: Link, shape: tuple[int, ...], dtype: np.dtype[Any], device: int, timeout: float | None
) -> np.ndarray[Any, Any]:
    """A new array in memory shared with the daemon of ``link`` (``Client.shared_array``)."""
    transport = link.transport
    assert isinstance(transport, LinkTransport)
    shared = transport.bytes
    if not isinstance(shared, SharedBytes):
        raise no_shared_memory()
    return shared.shared_array(shape, dtype, device, timeout)
