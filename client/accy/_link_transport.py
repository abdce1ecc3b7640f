"""Choosing a link's transport, once: from the target, ``ACCY_RING`` and ``ACCY_SHM``.

``open_transport`` gives each link (attachment) its ``LinkTransport``: launches
through the shared ring on a Unix socket, through a ring over a ``RingStream``
call on TCP (or with ``ACCY_RING=stream``), or as unary calls with
``ACCY_RING=0``; buffer bytes through shared memory on a Unix socket unless
``ACCY_SHM=0`` or ``Client(shared_memory=False)``, else in streamed calls.

A ring is opened by the link's first launch (or first shared-memory copy), so a
client that never launches opens none; one the daemon refuses falls back to the
next way (shared ring, then ring stream, then unary calls), once for the link.
Nothing is swapped afterwards: the link keeps the way it found for good.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Protocol

import numpy as np

from accy._connection import Connection
from accy._link import Link
from accy._ring_path import RingLaunches, open_ring, open_stream_ring
from accy._scalars import check_scalars
from accy._seam import (
    CopyRequest,
    LaunchRequest,
    ReadRequest,
    Ticket,
    Transport,
    WaitRequest,
    WriteRequest,
)
from accy._shm import SharedBytes, SharedPool, no_shared_memory, shm_wanted
from accy._target import unix_socket_of
from accy._unary import StreamedBytes, UnaryLaunches
from accy.protocol import ring as layout

__all__ = ["STREAM", "LinkTransport", "open_transport", "shared_array", "shared_pool"]

STREAM = "stream"
"""``ACCY_RING=stream``: launch through a ring over a stream even on a local socket."""


class Launches(Protocol):
    """One way a link's launches go (``RingLaunches``, ``UnaryLaunches``)."""

    path: str

    def launch(self, request: LaunchRequest) -> Ticket: ...

    def wait(self, request: WaitRequest) -> None: ...

    def forget(self, object_id: str) -> None: ...

    def copy(self, request: CopyRequest) -> int: ...

    def close(self, drain: float = 0.0) -> None: ...


class LinkTransport:
    """A link's ``Transport``: its launches and its bytes, each chosen once.

    With rings wanted (``ways``), the launches are found by the first launch or copy
    (``_opened``) and kept for the link's life; until then nothing was launched, so a
    wait has nothing to wait for and nothing is bound to forget.
    """

    def __init__(
        self,
        conn: Connection,
        link: Link,
        ways: tuple[str, ...],
        streamed: StreamedBytes,
        pool: SharedPool | None,
    ) -> None:
        self._conn = conn
        self._link = link
        self._ways = ways
        self._opening = threading.Lock()
        self._launches: Launches | None = None if ways else UnaryLaunches(conn, link)
        self.bytes: SharedBytes | StreamedBytes = streamed
        if pool is not None:
            self.bytes = SharedBytes(pool, self, streamed)

    @property
    def path(self) -> str:
        launches = self._launches
        return "pending" if launches is None else launches.path

    @property
    def launches(self) -> Launches | None:
        """The way launches go, once found (``None`` before the link's first launch)."""
        return self._launches

    def launch(self, request: LaunchRequest) -> Ticket:
        launches = self._launches
        if launches is None:
            check_scalars(request.session.info, request.scalars)  # refused: opens nothing
            launches = self._opened(request.timeout)
        return launches.launch(request)

    def wait(self, request: WaitRequest) -> None:
        launches = self._launches
        if launches is not None:
            launches.wait(request)

    def forget(self, object_id: str) -> None:
        launches = self._launches
        if launches is not None:
            launches.forget(object_id)

    def write(self, request: WriteRequest) -> int:
        return self.bytes.write(request)

    def read(self, request: ReadRequest) -> np.ndarray[Any, Any]:
        return self.bytes.read(request)

    def copy(self, request: CopyRequest) -> int:
        """A shared-memory copy: a COPY record on a shared ring (in its order with the
        launches, and no call), else a ``CopySegment`` call."""
        launches = self._launches
        if launches is None:
            launches = self._opened(request.timeout)
        return launches.copy(request)

    def close(self, drain: float = 0.0) -> None:
        launches = self._launches
        if launches is not None:
            launches.close(drain)
        self.bytes.close()

    def abandon(self) -> None:
        """In a forked child: let go of the ring the parent's process owns, writing nothing.
        The child's client refuses every call (``Connection.check_open``), and a wait on the
        ring let go of says so (``RingLaunches._judged``)."""
        launches = self._launches
        if isinstance(launches, RingLaunches):
            launches.abandon()

    def _opened(self, timeout: Any) -> Launches:
        """The launches the link uses from now on: the first ring that opens, else calls."""
        conn, link = self._conn, self._link
        with self._opening:
            if self._launches is not None:  # another thread opened it meanwhile
                return self._launches
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
            self._launches = found or UnaryLaunches(conn, link)
            return self._launches


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
    return LinkTransport(conn, link, ways_wanted(conn.target), streamed, pool)


def shared_pool(transport: Transport) -> SharedPool | None:
    """The segments a link's ``transport`` shares with its daemon, where its bytes go through
    shared memory (for benchmarks and tests that look inside: ``accy.testing.transport_of``)."""
    shared = transport.bytes if isinstance(transport, LinkTransport) else None
    return shared.pool if isinstance(shared, SharedBytes) else None


def shared_array(
    link: Link, shape: tuple[int, ...], dtype: np.dtype[Any], device: int, timeout: float | None
) -> np.ndarray[Any, Any]:
    """A new array in memory shared with the daemon of ``link`` (``Client.shared_array``)."""
    transport = link.transport
    shared = transport.bytes if isinstance(transport, LinkTransport) else None
    if not isinstance(shared, SharedBytes):
        raise no_shared_memory()
    return shared.shared_array(shape, dtype, device, timeout)
