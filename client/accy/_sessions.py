"""``Session``: a loaded pipeline on the daemon, launched many times, then released; and
``Launch``, one launch of it.

A session launches through its link's transport and never asks which one it is
(``accy._seam``): it hands the transport a ``LaunchRequest``, and the transport
checks, packs and sends it and hands back a ticket that the ``Launch`` wraps. Its
other calls (load, scratch, release) are its connection's ``Control``'s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from accy._connection import UNSET, Connection
from accy._control import Control, Loaded
from accy._link import Link, device_replaced, names_client
from accy._models import PipelineInfo
from accy._requests import released_error
from accy._resources import Buffer, Resource
from accy._seam import LaunchRequest, Ticket, WaitRequest
from accy.errors import AccyError, SessionLost, Unavailable

__all__ = ["Launch", "Session", "new_session"]


def _release_dropped(control: Control, key: int, state: list[tuple[str, Link]]) -> None:
    """The safety net of a session collected unreleased: release it in the background."""
    conn = control.conn
    conn.sessions.discard(key)
    session_id, link = state[0]
    if conn.closed or link.lost is not None:
        return
    link.transport.forget(session_id)
    control.release_later(session_id, link)


def new_session(control: Control, loaded: Loaded, link: Link) -> Session:
    """The ``Session`` for a load the daemon answered on ``link`` (for ``Client`` only)."""
    conn = control.conn
    session = object.__new__(Session)
    session._control = control
    session._conn = conn
    session._lock = threading.RLock()
    session.device = loaded.device
    session._scratch = None
    session._failure = None
    session._unwaited = None
    session._where = []
    session._replaced = False
    session._take(loaded, link)
    session._key = conn.sessions.add(session._move)
    session._arm(_release_dropped, control, session._key, session._where)
    return session


class Session(Resource):
    """A loaded pipeline with its own stream on the daemon: launch it many times, then release.

    When the client attaches to a restarted daemon, or after a fault took the
    session's device alone (the call that met it raises ``Unavailable``,
    reason ``DEVICE_LOST``), the session is loaded again (its scratch too) and
    keeps working under a new ``id``; if that fails, its calls raise
    ``SessionLost``. Sessions are made by ``Client.load``; a released one raises
    ``FailedPrecondition`` (reason ``SESSION_RELEASED``).
    """

    device: int
    created: bool
    format: str
    info: PipelineInfo
    _control: Control
    _conn: Connection
    _lock: threading.RLock
    _id: str
    _link: Link
    _key: int
    _scratch: dict[str, float] | None
    _failure: AccyError | None
    _unwaited: tuple[Link, str] | None
    """Where the last launch made without waiting went (link, and the session's id there)."""
    _where: list[tuple[str, Link]]
    """``[(id, link)]``: where the session is now, shared with its safety net."""
    _replaced: bool
    """A fault took its device (the daemon lives on): load it again before the next call."""

    def __init__(self, *_: object, **__: object) -> None:
        raise TypeError("a Session is made by Client.load()")

    def _take(self, loaded: Loaded, link: Link) -> None:
        if self._where:  # loaded again: what the old id was bound to goes
            old_id, old = self._where[0]
            old.transport.forget(old_id)
        self._id = loaded.session_id
        self._link = link
        self._where[:] = [(self._id, link)]
        self.created = loaded.created
        self.format = loaded.format
        self.info = loaded.info

    @property
    def id(self) -> str:
        """The session's id on the daemon (a new one after the client reattached)."""
        return self._id

    def __repr__(self) -> str:
        state = " released" if self.closed else " lost" if self._failure else ""
        info = self.info
        return f"<accy.Session {self.id} {info.target} v{info.version} {self.format}{state}>"

    def _move(self, link: Link) -> bool:
        """Load the session again on ``link`` (with its scratch); whether that worked.

        ``Unavailable`` (that daemon is going away too) propagates; any other
        refusal leaves the session lost, and its calls raise ``SessionLost``.
        """
        with self._lock:
            if self.closed:
                return True
            if (self._link is link and not self._replaced) or self._failure is not None:
                return self._failure is None
            old_id, why = self._id, self._link.lost or "the client attached again"
            if self._link is link:
                why = f"a fault took device {self.device}"
            control, info = self._control, self.info
            try:
                loaded, _ = control.load(info.target, info.version, self.format, self.device, link)
                if self._scratch is not None:
                    control.allocate_intermediates(
                        info, self._scratch, lambda _: loaded.session_id, link
                    )
            except Unavailable:
                raise
            except AccyError as error:
                if link.lost is not None:
                    raise
                self._failure = SessionLost(old_id, self.info.target, why, error)
                return False
            self._replaced = False
            self._take(loaded, link)
            return True

    def _id_on(self, link: Link) -> str:
        """This session's id for a call on ``link``, loading it there first if need be (the
        transport's hook: ``accy._seam.session_id_on``)."""
        if self.closed:
            raise released_error(self._id, self.info.target)
        if self._link is not link or self._replaced:
            self._move(link)
        if self._failure is not None:
            raise self._failure.with_traceback(None)
        return self._id

    def _current(self, timeout: float | None) -> Link:
        """The link to launch on now (waiting while the client attaches again), with this
        session there."""
        conn = self._conn
        left = conn.timeout_of(timeout)
        link = conn.current_link(None if left is None else time.monotonic() + left)
        self._id_on(link)
        return link

    def allocate_intermediates(self, **scalars: float) -> int:
        """Allocate the session's scratch once for these scalars; returns its size in bytes.

        The scalars are remembered: a reloaded session gets the same scratch.
        """
        self._id_on(self._link)  # a released session says so before anything else
        try:
            size = self._control.allocate_intermediates(self.info, scalars, self._id_on)
        except Unavailable as error:
            self._note(error)
            raise
        with self._lock:
            self._scratch = dict(scalars)
        return size

    def launch(
        self,
        operands: Sequence[Buffer | str] = (),
        results: Sequence[Buffer | str] = (),
        wait: bool = True,
        *,
        timeout: float | None = UNSET,
        **scalars: float,
    ) -> Launch:
        """Enqueue the pipeline on this session's stream; with ``wait``, return once it finished.

        A pipeline with intermediates needs scratch: call ``allocate_intermediates``
        once first. Without it each launch gets scratch of its own, which the daemon
        allocates, waits for and frees around that launch, so ``wait=False`` then
        does not overlap launches. A missing, unknown or ill-typed scalar raises here,
        before anything is sent. A refusal of a launch nobody waited for is raised
        by a later launch or wait of the session (through a ring: by the ring's next
        launch or wait, naming the launch's record).

        A buffer of a daemon that restarted raises ``BufferLost``; a launch the
        daemon lost its device over raises ``Unavailable`` with reason
        ``DEVICE_LOST`` and ``session`` naming the session that faulted.
        """
        link = self._conn.link
        request = LaunchRequest(self, operands, results, scalars, wait, timeout)
        try:
            if link is not self._link or self._replaced:
                link = self._current(timeout)
            ticket = link.transport.launch(request)
        except AccyError as error:  # raised here, no frame holding it: a cycle keeps buffers
            if isinstance(error, Unavailable):
                self._note(error)
            if not names_client(error):
                raise
            link, ticket = self._again(request)
        if not wait:
            self._unwaited = (link, ticket.session_id)
        launch = object.__new__(Launch)
        launch.session = self
        launch._ticket = ticket
        return launch

    def _again(self, request: LaunchRequest) -> tuple[Link, Ticket]:
        """Send a launch once more, the daemon having refused it because it did not know
        this client (it did nothing): on the next link, once the client attached again."""
        link = self._current(request.timeout)
        try:
            return link, link.transport.launch(request)
        except Unavailable as again:
            self._note(again)
            raise

    def _note(self, error: Unavailable) -> None:
        """After ``error``: load the session again before its next call if a fault took its
        device alone (the daemon lives on)."""
        if device_replaced(error, self.device):
            with self._lock:
                self._replaced = True

    def wait(self, timeout: float | None = UNSET) -> None:
        """Wait for every launch of this session so far.

        A launch made without waiting that the daemon refused raises here, naming
        it, unless something reported it already. Launches that the daemon lost
        when it restarted raise ``Unavailable`` (once).
        """
        try:
            pending = self._unwaited
            if pending is not None and pending[0].lost is not None:
                self._unwaited = None
                old, old_id = pending
                old.transport.wait(WaitRequest(None, old_id, timeout))  # why its work was lost
            link = self._conn.link
            if link is not self._link or self._replaced:
                link = self._current(timeout)
            link.transport.wait(WaitRequest(None, self._id_on(link), timeout))
            if self._unwaited is pending:
                self._unwaited = None
        except Unavailable as error:
            self._note(error)
            raise

    def release(self) -> None:
        """Let this load go (idempotent); the last one waits for the session's work, then
        frees its pool, scratch and stream."""
        self.close()

    def _close(self) -> None:
        conn = self._conn
        conn.sessions.discard(self._key)
        with self._lock:
            link = self._link
        if conn.closed or link.lost is not None or self._failure is not None:
            return
        link.transport.forget(self._id)  # before the call, which the daemon takes after it
        self._control.release(self._id, link)


class Launch:
    """One launch of a session: done already if it was waited for, else ``wait()`` for it.

    If the daemon refused a launch made without waiting, ``wait()`` raises why, or
    else the session's next launch or ``wait`` does. Launches are made by
    ``Session.launch``.
    """

    __slots__ = ("_ticket", "session")

    session: Session
    _ticket: Ticket

    def __init__(self, *_: object, **__: object) -> None:
        raise TypeError("a Launch is made by Session.launch()")

    @property
    def completed(self) -> bool:
        """Whether the launch is known to have finished on the device."""
        return self._ticket.completed

    @property
    def id(self) -> str | None:
        """The daemon's id of the launch (``lau_...``), from its answer to a ``Launch`` call;
        ``None`` for a launch through a ring, which gets no answer of its own (``record``
        names it there)."""
        return self._ticket.launch_id

    @property
    def record(self) -> int | None:
        """The ring record that carried the launch (the daemon's errors name it); ``None``
        for a launch made by a call."""
        return self._ticket.record

    @property
    def enqueue_seconds(self) -> float | None:
        """The daemon's time from reading the request to enqueuing the launch; ``None`` for a
        launch through a ring (no answer of its own: the daemon's metrics time those)."""
        return self._ticket.enqueue_seconds

    @property
    def elapsed_seconds(self) -> float | None:
        """The daemon's time from reading the request to answering it (to the end of the
        work, for a waited launch); ``None`` for a launch through a ring."""
        return self._ticket.elapsed_seconds

    def __repr__(self) -> str:
        ticket = self._ticket
        what = f"ring record {ticket.record}" if ticket.record is not None else ticket.launch_id
        state = "completed" if ticket.completed else "enqueued"
        return f"<accy.Launch {what} of {ticket.session_id} {state}>"

    def wait(self, timeout: float | None = UNSET) -> Launch:
        """Block until this launch finished on the device; returns ``self``.

        A launch the daemon refused raises why. A launch that the daemon lost
        when it restarted raises ``Unavailable`` (reason ``DEVICE_LOST`` after
        a device fault, ``session`` naming the culprit).
        """
        ticket = self._ticket
        if ticket.completed:
            return self
        try:
            ticket.waiter.wait(WaitRequest(ticket, None, timeout))
        except Unavailable as error:
            self.session._note(error)
            raise
        ticket.completed = True
        return self
