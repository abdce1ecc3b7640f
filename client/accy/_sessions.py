"""``Session``: a loaded pipeline on the daemon, launched many times, then released."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

import numpy as np

from accy import _dtypes
from accy._connection import UNSET, Connection
from accy._kept import KeptPlan, keepable
from accy._launching import (
    Launch,
    launch_on,
    new_launch,
    ring_errors,
    ring_launch,
    ring_of,
    ring_timeout,
    settle_session,
)
from accy._link import Link, device_replaced
from accy._models import PipelineInfo
from accy._resources import Buffer, Resource, buffer_ids
from accy._ring import RingClosed
from accy._ring_path import RingPath
from accy.errors import AccyError, FailedPrecondition, SessionLost, Unavailable
from accy.protocol.launch.v1 import launch_pb2 as pb

__all__ = ["Session", "new_session"]

_PACKED_KEPT = 64
"""Distinct sets of scalar values a session keeps packed for its next launches."""


def _release_dropped(conn: Connection, key: int, state: list[tuple[str, Link]]) -> None:
    """The safety net of a session collected unreleased: release it in the background."""
    conn.sessions.discard(key)
    session_id, link = state[0]
    if conn.closed or link.lost is not None:
        return
    if link.ring is not None:
        link.ring.forget(session_id)
    request = pb.ReleaseRequest(session_id=session_id)
    conn.later(lambda: conn.call(conn.stub.Release, request, link=link))


def _exact(value: object) -> object:
    """``value`` as a cache key that tells apart what compares equal but packs differently:
    ``-0.0`` and ``0.0`` (a float's exact text); other values as they are."""
    if isinstance(value, float | np.floating):
        return float(value).hex()
    return value


def new_session(
    conn: Connection, response: pb.LoadPipelineResponse, link: Link, device: int
) -> Session:
    """The ``Session`` for a load the daemon answered on ``link`` (for ``Client`` only)."""
    session = object.__new__(Session)
    session._conn = conn
    session._lock = threading.RLock()
    session.device = device
    session._scratch = None
    session._failure = None
    session._unwaited = None
    session._packed = {}
    session._checked = set()
    session._where = []
    session._replaced = False
    session._take(response, link)
    session._key = conn.sessions.add(session._move)
    session._arm(_release_dropped, conn, session._key, session._where)
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
    _conn: Connection
    _lock: threading.RLock
    _id: str
    _link: Link
    _key: int
    _scratch: dict[str, float] | None
    _failure: AccyError | None
    _unwaited: Link | None
    _packed: dict[tuple[tuple[str, type, object], ...], dict[str, pb.Scalar]]
    _checked: set[tuple[tuple[tuple[str, object], ...], tuple[type, ...]]]
    """Scalars a ring launch had before that the pipeline takes (names and types)."""
    _ring: RingPath | None = None
    """The ring this session launched on last, if any: ``wait`` waits there too."""
    _ring_specs: list[tuple[str, str]] | None = None
    _kept: KeptPlan | None = None
    _where: list[tuple[str, Link]]
    """``[(id, link)]``: where the session is now, shared with its safety net."""
    _replaced: bool
    """A fault took its device (the daemon lives on): load it again before the next call."""

    def __init__(self, *_: object, **__: object) -> None:
        raise TypeError("a Session is made by Client.load()")

    def _take(self, response: pb.LoadPipelineResponse, link: Link) -> None:
        self._kept = None  # its plan names the session by its old id
        if self._where and (old := self._where[0][1].ring) is not None:
            old.forget(self._id)  # loaded again after a fault: the old id's handle goes
        self._id = response.session_id
        self._link = link
        self._where[:] = [(self._id, link)]
        self.created = response.created
        self.format = response.format
        self.info = PipelineInfo.from_proto(response.pipeline)

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
            conn = self._conn
            try:
                response, _ = conn.call(
                    conn.stub.LoadPipeline,
                    pb.LoadPipelineRequest(
                        target=self.info.target,
                        version=self.info.version,
                        format=self.format,
                        device=self.device,
                    ),
                    link=link,
                )
                if self._scratch is not None:
                    conn.call(
                        conn.stub.AllocateIntermediates,
                        pb.AllocateIntermediatesRequest(
                            session_id=response.session_id,
                            runtime_scalars=self._scalars(self._scratch),
                        ),
                        link=link,
                    )
            except Unavailable:
                raise
            except AccyError as error:
                if link.lost is not None:
                    raise
                self._failure = SessionLost(old_id, self.info.target, why, error)
                return False
            self._replaced = False
            self._take(response, link)
            return True

    def _on(self, link: Link) -> str:
        """This session's id for a call on ``link``, loading it there first if need be."""
        if self.closed:
            raise FailedPrecondition(
                f"session {self._id} ({self.info.target}) was released; load the pipeline "
                "again to use it",
                reason="SESSION_RELEASED",
            )
        if self._link is not link or self._replaced:
            self._move(link)
        if self._failure is not None:
            raise self._failure.with_traceback(None)
        return self._id

    def _scalars(self, values: Mapping[str, object]) -> dict[str, pb.Scalar]:
        """The scalars typed for the wire; the same values again reuse the same messages."""
        key = tuple((name, type(value), _exact(value)) for name, value in values.items())
        try:
            packed = self._packed.get(key)
        except TypeError:  # an unhashable value: packing says what is wrong with it
            return _dtypes.pack_scalars(self.info.runtime_scalars, values)
        if packed is None:
            packed = _dtypes.pack_scalars(self.info.runtime_scalars, values)
            if len(self._packed) >= _PACKED_KEPT:
                self._packed.clear()
            self._packed[key] = packed
        return packed

    def _check_scalars(self, values: Mapping[str, object]) -> None:
        """Refuse here what ``_scalars`` refuses (names the pipeline does not take, values
        their type cannot hold), for a ring launch, which packs its record itself: the same
        values again are looked up, not typed again."""
        key = (tuple(values.items()), tuple(map(type, values.values())))
        try:
            if key in self._checked:
                return
        except TypeError:  # an unhashable value: packing says what is wrong with it
            _dtypes.pack_scalars(self.info.runtime_scalars, values)
            return
        _dtypes.pack_scalars(self.info.runtime_scalars, values)
        if len(self._checked) >= _PACKED_KEPT:
            self._checked.clear()
        self._checked.add(key)

    def allocate_intermediates(self, **scalars: float) -> int:
        """Allocate the session's scratch once for these scalars; returns its size in bytes.

        The scalars are remembered: a reloaded session gets the same scratch.
        """
        self._on(self._link)  # a released session says so before anything else
        packed = self._scalars(scalars)
        conn = self._conn
        try:
            response = conn.unary(
                conn.stub.AllocateIntermediates,
                lambda link: pb.AllocateIntermediatesRequest(
                    session_id=self._on(link), runtime_scalars=packed
                ),
            )
        except Unavailable as error:
            self._note(error)
            raise
        with self._lock:
            self._scratch = dict(scalars)
        return response.byte_size

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
        does not overlap launches. On a local daemon launches go through the
        same-host ring; a refusal of one nobody waited for is raised by the next
        launch or wait of the session.

        A buffer of a daemon that restarted raises ``BufferLost``; a launch the
        daemon lost its device over raises ``Unavailable`` with reason
        ``DEVICE_LOST`` and ``session`` naming the session that faulted.
        """
        try:
            return self._launch(operands, results, wait, timeout, scalars)
        except Unavailable as error:
            self._note(error)
            raise

    def _note(self, error: Unavailable) -> None:
        """After ``error``: load the session again before its next call if a fault took its
        device alone (the daemon lives on)."""
        if device_replaced(error, self.device):
            with self._lock:
                self._replaced = True

    def _launch(
        self,
        operands: Sequence[Buffer | str],
        results: Sequence[Buffer | str],
        wait: bool,
        timeout: float | None,
        scalars: dict[str, float],
    ) -> Launch:
        self._check_scalars(scalars)  # before anything else, a first launch's ring included
        kept = self._kept
        if (  # the same buffers as the last ring launch, and nothing changed since
            kept is not None
            and kept.link is self._conn.link
            and kept.link is self._link
            and kept.link.ring is kept.ring
            and kept.link.lost is None
            and not self._replaced
            and self._failure is None
            and tuple(map(id, operands)) == kept.operands
            and tuple(map(id, results)) == kept.results
        ):
            return self._launch_on_ring(
                kept.ring, kept.link, kept, operands, results, wait, timeout, scalars
            )
        ring, link = ring_of(self._conn, timeout)
        if ring is not None:
            return self._launch_on_ring(ring, link, None, operands, results, wait, timeout, scalars)
        packed = self._scalars(scalars)

        def request(link: Link) -> pb.LaunchRequest:
            return pb.LaunchRequest(
                session_id=self._on(link),
                operands=buffer_ids(operands, link),
                results=buffer_ids(results, link),
                runtime_scalars=packed,
                wait=wait,
            )

        response, link = launch_on(self._conn, request, timeout)
        if not wait:
            self._unwaited = link
        return new_launch(self, self._conn, response, link)

    def _launch_on_ring(
        self,
        ring: RingPath,
        link: Link,
        kept: KeptPlan | None,
        operands: Sequence[Buffer | str],
        results: Sequence[Buffer | str],
        wait: bool,
        timeout: float | None,
        scalars: dict[str, float],
    ) -> Launch:
        """One launch as a record on the link's ring (no call), of the ``kept`` plan if it
        is still good; see ``launch``."""
        left = ring_timeout(self._conn, timeout)
        try:  # ring_errors, in its exceptional path only: every launch comes here
            seq = None
            if kept is not None:
                seq = ring.launch_planned(kept.plan, kept.changes, scalars, wait=wait, timeout=left)
            while seq is None:
                plan, changes = ring.plan(
                    self._on(link),
                    self._specs(),
                    buffer_ids(operands, link),
                    buffer_ids(results, link),
                    left,
                )
                self._kept = None
                if keepable(operands) and keepable(results):
                    self._kept = KeptPlan(link, ring, plan, changes, operands, results)
                seq = ring.launch_planned(plan, changes, scalars, wait=wait, timeout=left)
        except (AccyError, RingClosed):
            with ring_errors(self._conn, link, f"a launch of session {self.id}"):
                raise
        self._ring = ring
        return ring_launch(self, self._conn, link, ring, seq, wait)

    def _specs(self) -> list[tuple[str, str]]:
        """The runtime scalars' names and types, as a ring record packs them."""
        specs = self._ring_specs
        if specs is None:
            specs = self._ring_specs = [
                (spec.name, _dtypes.name_of(spec.dtype)) for spec in self.info.runtime_scalars
            ]
        return specs

    def wait(self, timeout: float | None = UNSET) -> None:
        """Wait for every launch of this session so far.

        A launch made without waiting that the daemon refused raises here, naming
        it, unless something reported it already. Launches that the daemon lost
        when it restarted raise ``Unavailable`` (once).
        """
        try:
            self._wait(timeout)
        except Unavailable as error:
            self._note(error)
            raise

    def _wait(self, timeout: float | None) -> None:
        ring = self._ring
        if ring is not None and self._link.ring is ring:
            try:
                ring.wait(None, ring_timeout(self._conn, timeout))
            except (AccyError, RingClosed):  # judged as ring_errors says, only when raised
                with ring_errors(self._conn, self._link, f"work enqueued on session {self.id}"):
                    raise
            if self._unwaited is None:
                return
        pending = self._unwaited
        if pending is not None and pending.lost is not None:
            self._unwaited = None
            raise pending.lost_error(f"work enqueued on session {self.id}")
        conn = self._conn
        if pending is not None and pending is self._link:  # a refusal not reported yet raises
            settle_session(conn, pending, self._id, timeout)
        conn.unary(
            conn.stub.WaitLaunch,
            lambda link: pb.WaitLaunchRequest(session_id=self._on(link)),
            timeout,
        )
        if self._unwaited is pending:
            self._unwaited = None

    def release(self) -> None:
        """Let this load go (idempotent); the last one waits for the session's work, then
        frees its pool, scratch and stream."""
        self.close()

    def _close(self) -> None:
        self._kept = None
        conn = self._conn
        conn.sessions.discard(self._key)
        with self._lock:
            link = self._link
        if conn.closed or link.lost is not None or self._failure is not None:
            return
        if link.ring is not None:  # before the call, which the daemon takes after the ring
            link.ring.forget(self._id)
        try:
            conn.call(conn.stub.Release, pb.ReleaseRequest(session_id=self._id), link=link)
        except AccyError:
            if link.lost is None:
                raise
