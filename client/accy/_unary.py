"""Launches and buffer bytes over plain gRPC calls: the transport every daemon serves.

``UnaryLaunches`` sends each launch as one ``Launch`` call (``ACCY_RING=0``, or a
daemon that hands out no rings) and waits with ``WaitLaunch``; a launch made
without waiting returns once the daemon enqueued it, and a refusal raises from
that call. ``StreamedBytes`` moves buffer data in ``WriteBuffer`` and
``ReadBuffer`` chunks. Both are one link's, and its calls are ordered after
the link's ring records by ``Connection``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from accy import _chunks
from accy._connection import Connection
from accy._link import Link, device_lost
from accy._requests import launch_request
from accy._seam import CopyRequest, LaunchRequest, ReadRequest, Ticket, WaitRequest, WriteRequest
from accy.errors import AccyError
from accy.protocol.launch.v1 import launch_pb2 as pb

__all__ = ["StreamedBytes", "UnaryLaunches", "copy_by_call"]


class UnaryLaunches:
    """One link's launches as ``Launch`` calls; keeps nothing between them."""

    path = "unary"
    copies = False
    """COPY records: none (shared-memory copies are ``CopySegment`` calls)."""

    def __init__(self, conn: Connection, link: Link) -> None:
        self._conn = conn
        self._link = link

    def launch(self, request: LaunchRequest) -> Ticket:
        link = self._link
        message = launch_request(request, link)
        conn = self._conn
        response, _ = conn.call(conn.stub.Launch, message, request.timeout, link=link)
        return Ticket(
            self,
            message.session_id,
            response.completed,
            launch_id=response.launch_id,
            enqueue_seconds=response.enqueue_seconds,
            elapsed_seconds=response.elapsed_seconds,
        )

    def wait(self, request: WaitRequest) -> None:
        link = self._link
        ticket, session_id, timeout = request
        if ticket is not None:
            session_id, launch_id, what = ticket.session_id, ticket.launch_id or "", ticket.name
        elif session_id is not None:
            launch_id, what = "", f"work enqueued on session {session_id}"
        else:
            return  # every call is answered once the daemon took it: nothing is on its way
        if link.lost is None:
            conn = self._conn
            message = pb.WaitLaunchRequest(session_id=session_id, launch_id=launch_id)
            try:
                conn.call(conn.stub.WaitLaunch, message, timeout, link=link)
                return
            except AccyError as error:
                if link.lost is None or device_lost(error):  # the daemon's own word on it
                    raise
        raise link.lost_error(what)

    def forget(self, object_id: str) -> None:
        """Nothing is kept per id here."""

    def copy(self, request: CopyRequest) -> int:
        return copy_by_call(self._conn, self._link, request)

    def close(self, drain: float = 0.0) -> None:
        """Nothing to close: each launch was its own call."""


def copy_by_call(conn: Connection, link: Link, request: CopyRequest) -> int:
    """A shared-memory copy as one ``CopySegment`` call; the bytes copied."""
    direction = pb.COPY_DIRECTION_TO_BUFFER if request.to_buffer else pb.COPY_DIRECTION_TO_SEGMENT
    message = pb.CopySegmentRequest(
        segment_id=request.segment_id,
        segment_offset=request.segment_offset,
        buffer_id=request.buffer_id,
        buffer_offset=request.buffer_offset,
        size=request.size,
        direction=direction,
    )
    answer, _ = conn.call(conn.stub.CopySegment, message, request.timeout, link=link)
    return int(answer.bytes_copied)


class StreamedBytes:
    """One link's buffer data in ``WriteBuffer`` and ``ReadBuffer`` chunks."""

    def __init__(self, conn: Connection, link: Link) -> None:
        self._conn = conn
        self._link = link

    def write(self, request: WriteRequest) -> int:
        buffer_id, _, data, offset, timeout, chunk_size, progress = request
        chunks = _chunks.write_chunks(buffer_id, data, offset, chunk_size, progress)
        conn = self._conn
        response = conn.stream_in(conn.stub.WriteBuffer, chunks, timeout, self._link)
        return int(response.bytes_written)

    def read(self, request: ReadRequest) -> np.ndarray[Any, Any]:
        buffer_id, _, offset, size, into, timeout, chunk_size, progress = request
        message = pb.ReadBufferRequest(
            buffer_id=buffer_id, offset=offset, size=size, chunk_size=chunk_size
        )
        conn = self._conn
        chunks = conn.stream_out(conn.stub.ReadBuffer, message, timeout, self._link)
        got = _chunks.gather(chunks, offset, size, progress)
        if into is None:
            return got
        flat = into.reshape(-1).view(np.uint8)
        flat[:] = got
        return flat

    def close(self) -> None:
        """Nothing to close: each transfer was its own call."""
