"""The launch path: a launch goes out on its link's LaunchStream and comes back as a Launch."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

from accy._connection import UNSET, Connection
from accy._launches import LaunchStream, Sent
from accy._link import Link, device_lost
from accy._ring import RingClosed
from accy._ring_path import RingPath, open_ring, open_stream_ring, ring_wanted, stream_ring_wanted
from accy.errors import AccyError, Unavailable
from accy.protocol.launch.v1 import launch_pb2 as pb

if TYPE_CHECKING:
    from accy._sessions import Session

__all__ = [
    "Launch",
    "launch_on",
    "launches_of",
    "new_launch",
    "ring_errors",
    "ring_launch",
    "ring_of",
    "ring_timeout",
    "settle_session",
]

RING_WAIT_CAP = 3600.0
"""A ring wait with no timeout still looks up this often (the daemon may have gone)."""

_opening = threading.Lock()


def ring_of(conn: Connection, timeout: float | None) -> tuple[RingPath | None, Link]:
    """The current link and its ring (opened on first use), or ``None`` for gRPC launches."""
    link = conn.link
    if link is not None and link.ring_tried:  # every launch but a link's first
        return link.ring, link
    left = conn.timeout_of(timeout)
    link = conn.current_link(None if left is None else time.monotonic() + left)
    if link.ring_tried:
        return link.ring, link
    socket_path = ring_wanted(conn.target)
    with _opening:
        if not link.ring_tried:
            lost = lambda: link.lost is not None  # noqa: E731
            ring = None
            if socket_path is not None:
                ring = open_ring(
                    lambda request: conn.call(conn.stub.OpenRing, request, left, link=link)[0],
                    socket_path,
                    lost,
                )
            if ring is None and stream_ring_wanted():
                ring = open_stream_ring(
                    conn.stub,
                    link.metadata,
                    conn.translate,
                    lost,
                    10.0 if left is None else left,
                    conn.launch_window,
                )
            link.ring = ring
            link.ring_tried = True
    return link.ring, link


class ring_errors:
    """Errors of ring work, judged as a call's are (a device fault loses the link); a ring
    closed under ``what`` raises why: the link's loss, else that it closed.

    Entered only once ring work raised (``except (AccyError, RingClosed):`` around the
    work, then ``with ring_errors(...): raise``), so the common path builds no context.
    """

    __slots__ = ("conn", "link", "what")

    def __init__(self, conn: Connection, link: Link, what: str) -> None:
        self.conn = conn
        self.link = link
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if isinstance(error, AccyError):
            judged = self.conn.judged(error, self.link)
            if judged is not error:
                raise judged from error
        elif isinstance(error, RingClosed):
            if self.link.lost is not None:
                raise self.link.lost_error(self.what) from error
            raise Unavailable(
                f"{self.what}: the daemon closed this client's ring ({error}); launch it again",
                reason="RING_CLOSED",
            ) from error


def ring_timeout(conn: Connection, timeout: float | None) -> float:
    left = conn.timeout_of(timeout)
    return RING_WAIT_CAP if left is None else left


def ring_launch(
    session: Session, conn: Connection, link: Link, ring: RingPath, seq: int, waited: bool
) -> Launch:
    """The ``Launch`` of ring record ``seq`` (for ``Session`` only)."""
    launch = object.__new__(Launch)
    launch.session = session
    launch._conn = conn
    launch._link = link
    launch._session_id = session.id
    launch.completed = waited
    launch._ring = ring
    launch._seq = seq
    return launch


def launches_of(conn: Connection, link: Link) -> LaunchStream:
    """``link``'s LaunchStream, opened (again) if need be."""
    with conn.cond:
        conn.check_open()
        stream = link.launches
        if stream is None or stream.broken:
            stream = link.launches = LaunchStream(
                conn.stub, link.metadata, conn.translate, conn.hint, conn.launch_window
            )
        return stream


def launch_on(
    conn: Connection, request: Callable[[Link], pb.LaunchRequest], timeout: float | None
) -> tuple[pb.LaunchResponse | Sent, Link]:
    """One launch on the current link's LaunchStream (as ``Connection.call`` makes a unary
    call). A launch that met a broken connection is not sent again: it may have run.

    A launch without ``wait`` returns as soon as it is written: ``Sent``, its answer to come.
    """

    def send(message: pb.LaunchRequest, use: Link, left: float | None) -> pb.LaunchResponse | Sent:
        stream = launches_of(conn, use)
        return stream.launch(message, left) if message.wait else stream.send(message, left)

    return conn.dispatch(request, send, conn.timeout_of(timeout), None, transport=False)


def settle_session(conn: Connection, link: Link, session_id: str, timeout: float | None) -> None:
    """Wait for the answers to the session's launches sent without waiting; raise a refusal
    among them (naming the launch) that nothing reported yet."""
    stream = link.launches
    if stream is not None and link.lost is None:
        try:
            stream.settle(session_id, conn.timeout_of(timeout))
        except AccyError as error:
            raise conn.judged(error, link) from None


def new_launch(
    session: Session, conn: Connection, response: pb.LaunchResponse | Sent, link: Link
) -> Launch:
    """The ``Launch`` the daemon answered (or will answer) on ``link`` (for ``Session`` only)."""
    launch = object.__new__(Launch)
    launch.session = session
    launch._conn = conn
    launch._link = link
    launch._session_id = session.id
    launch.completed = False
    if isinstance(response, Sent):
        launch._sent = response
    else:
        launch._sent = None
        launch._learn(response)
    return launch


class Launch:
    """One launch of a session: done already if it was waited for, else ``wait()`` for it.

    A launch made without waiting is sent before the daemon answered it: its
    ``id`` (and timings) are known once the answer came, and reading them
    waits for it. If the daemon refused it, ``wait()`` raises why, or else the
    session's next launch or ``wait`` does. Launches are made by ``Session.launch``.
    """

    def __init__(self, *_: object, **__: object) -> None:
        raise TypeError("a Launch is made by Session.launch()")

    session: Session
    completed: bool
    _enqueue_seconds: float = 0.0
    _elapsed_seconds: float = 0.0
    _conn: Connection
    _link: Link
    _session_id: str
    _ring: RingPath | None = None
    _seq: int = 0
    _sent: Sent | None = None
    """The answer still to come, for a launch sent without waiting."""
    _given_id: str | None = None
    """The daemon's launch id, once its answer came (a ring launch has none)."""

    @property
    def _id(self) -> str:
        """A ring launch is named by its record; another by the daemon's answer (read only
        once it came)."""
        if self._ring is not None:
            return f"ring-{self._seq}"
        return self._given_id or ""

    def _learn(self, response: pb.LaunchResponse) -> None:
        self._given_id = response.launch_id
        self.completed = response.completed
        self._enqueue_seconds = response.enqueue_seconds
        self._elapsed_seconds = response.elapsed_seconds

    def _answered(self, timeout: float | None = UNSET) -> None:
        """Make sure the daemon's answer came (within ``timeout``); its refusal raises."""
        sent = self._sent
        if sent is None:
            return
        link = self._link
        try:
            response = sent.stream.answer(sent, self._conn.timeout_of(timeout))
        except AccyError as error:
            if link.lost is None or device_lost(error):
                raise self._conn.judged(error, link) from None
            raise link.lost_error(sent.name()) from None
        self._learn(response)
        self._sent = None

    @property
    def id(self) -> str:
        """The launch's id on the daemon (waits for its answer if it has not come yet)."""
        self._answered()
        return self._id

    @property
    def enqueue_seconds(self) -> float:
        """The daemon's time from reading the request to enqueuing the launch."""
        self._answered()
        return self._enqueue_seconds

    @property
    def elapsed_seconds(self) -> float:
        """The daemon's time from reading the request to answering it."""
        self._answered()
        return self._elapsed_seconds

    def __repr__(self) -> str:
        state = "completed" if self.completed else "enqueued"
        if self._sent is not None:
            return f"<accy.Launch #{self._sent.tag} of {self._session_id} sent>"
        return f"<accy.Launch {self._id} of {self._session_id} {state}>"

    def wait(self, timeout: float | None = UNSET) -> Launch:
        """Block until this launch finished on the device; returns ``self``.

        A launch the daemon refused raises why. A launch that the daemon lost
        when it restarted raises ``Unavailable`` (reason ``DEVICE_LOST`` after
        a device fault, ``session`` naming the culprit).
        """
        if self.completed:
            return self
        if self._ring is not None:
            try:
                self._ring.wait(self._seq, ring_timeout(self._conn, timeout))
            except (AccyError, RingClosed):  # judged as ring_errors says, only when raised
                what = f"launch {self.id} of session {self._session_id}"
                with ring_errors(self._conn, self._link, what):
                    raise
            self.completed = True
            return self
        self._answered(timeout)
        link = self._link
        if link.lost is None:
            conn = self._conn
            try:
                conn.call(
                    conn.stub.WaitLaunch,
                    pb.WaitLaunchRequest(session_id=self._session_id, launch_id=self._id),
                    timeout,
                    link=link,
                )
            except AccyError as error:
                if link.lost is None or device_lost(error):
                    raise
            else:
                self.completed = True
                return self
        raise link.lost_error(f"launch {self._id} of session {self._session_id}")
