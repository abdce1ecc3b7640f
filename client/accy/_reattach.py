"""Staying attached: the attach and ping threads, reattaching with jittered back-off.

When the Attach stream breaks (the daemon restarted, after a device fault or
otherwise) the attach thread attaches again, loads the open sessions again and
publishes the new link; calls made meanwhile wait for it. Once it gave up (past
``reattach_timeout``), the next call has it try again rather than stay broken.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import threading
import time
from collections.abc import Callable

import grpc

from accy._attach import AttachStream
from accy._connection import Connection
from accy._link import Link, device_lost
from accy._link_transport import open_transport
from accy._models import Reattachment
from accy.errors import AccyError, PermissionDenied, Unauthenticated, Unavailable
from accy.protocol import CLIENT_ID_METADATA, DEVICE_LOST
from accy.protocol.launch.v1 import launch_pb2 as pb

__all__ = ["FIRST_RETRY", "MAX_RETRY", "Attacher", "backoff"]

FIRST_RETRY = 0.05
"""The back-off's base: the first retry waits up to this long."""
MAX_RETRY = 1.0
"""The back-off's cap: no retry waits longer."""

log = logging.getLogger("accy")


def backoff(attempt: int, base: float = FIRST_RETRY, cap: float = MAX_RETRY) -> float:
    """Seconds to wait before retry ``attempt`` (0, 1, ...): full jitter, uniform in
    ``0..min(cap, base * 2**attempt)``, so clients that lost one daemon do not retry in step."""
    return random.uniform(0.0, min(cap, base * 2.0 ** min(attempt, 64)))


class Attacher:
    """Keeps a ``Connection`` attached: opens the first link, then watches and replaces it."""

    def __init__(
        self,
        connection: Connection,
        *,
        name: str,
        liveness: int,
        attach_timeout: float,
        reattach_timeout: float | None,
        on_reattach: Callable[[Reattachment], None] | None,
    ) -> None:
        self._conn = connection
        self._name = name
        self._liveness = liveness
        self._attach_timeout = attach_timeout
        self.reattach_timeout = reattach_timeout
        self._on_reattach = on_reattach
        self.history: list[Reattachment] = []
        self._thread: threading.Thread | None = None
        self._gave_up: Link | None = None
        """The link it stopped trying to replace, until a call has it try again."""

    def start(self) -> Link:
        """Attach (raising why not) and start the attach and ping threads; returns the link."""
        conn = self._conn
        link = self._new_link(self._open(self._attach_timeout, wait=False), 0)
        with conn.cond:
            conn.publish(link)
        self._thread = threading.Thread(
            target=self._keep_attached, args=(link,), name="accy-attach", daemon=True
        )
        self._thread.start()
        conn.revive = self.revive
        if self._liveness:
            threading.Thread(target=self._keep_alive, name="accy-ping", daemon=True).start()
        return link

    @property
    def alive(self) -> bool:
        """Whether the attach thread still runs."""
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float) -> None:
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _open(self, timeout: float | None, *, wait: bool) -> AttachStream:
        conn = self._conn
        return AttachStream.open(
            conn.stub,
            self._name,
            conn.auth,
            conn.translate,
            timeout,
            wait_for_ready=wait,
            liveness_seconds=self._liveness,
        )

    def _new_link(self, stream: AttachStream, generation: int) -> Link:
        client_id = stream.attachment.client_id
        link = Link(generation, stream, (*self._conn.auth, (CLIENT_ID_METADATA, client_id)))
        given = self._conn.transport
        link.transport = open_transport(self._conn, link) if given is None else given
        return link

    def revive(self) -> bool:
        """(Under the connection's lock, from a call that found the client broken.) Try to
        attach again, for another ``reattach_timeout``; whether a new round started (not
        where reattaching is off, or the client closes)."""
        conn, old = self._conn, self._gave_up
        if old is None or self.reattach_timeout == 0:
            return False
        if conn.stopping.is_set():
            return False
        self._gave_up = None
        conn.broken = None
        old.lost_at = time.monotonic()  # the new round's time counts from now
        self._thread = threading.Thread(
            target=self._keep_attached, args=(old, True), name="accy-attach", daemon=True
        )
        self._thread.start()
        return True

    def _keep_alive(self) -> None:
        """The ping thread: tell the daemon this client lives, four times per liveness period.

        A hung process stops pinging with everything else, so the daemon frees
        what it holds; a live but idle one keeps its sessions and buffers.
        """
        conn = self._conn
        period = self._liveness / 4
        request = pb.PingRequest()
        while not conn.stopping.wait(period):
            link = conn.link
            if link is None:  # reattaching: the new Attach is news enough
                continue
            with contextlib.suppress(grpc.RpcError, ValueError):  # ValueError: channel closed
                conn.stub.Ping(request, metadata=link.metadata, timeout=period)

    def _keep_attached(self, link: Link, lost: bool = False) -> None:
        """The attach thread: pump the stream; when it breaks (or it is ``lost`` already),
        attach again (or give up)."""
        conn = self._conn
        try:
            while True:
                if not lost:
                    ended = link.stream.pump()
                    if conn.stopping.is_set():
                        return
                    conn.lose(link, ended)
                lost = False
                following = self._reattach(link)
                if following is None:
                    return
                link = following
        except BaseException as error:  # a bug here must not leave callers waiting
            if conn.stopping.is_set():  # closed under it: its calls failed, as they should
                return
            log.exception("the accy attach thread failed")
            self._give_up(link, Unavailable(f"the client's attach thread failed: {error!r}"))

    def _reattach(self, old: Link) -> Link | None:
        """Attach again with back-off, reload the sessions, publish the new link."""
        conn = self._conn
        limit = self.reattach_timeout
        deadline = math.inf if limit is None else old.lost_at + limit
        failure: AccyError | None = None
        attempt = 0
        while not conn.stopping.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                stream = self._open(min(remaining, self._attach_timeout), wait=True)
            except (Unauthenticated, PermissionDenied) as error:
                self._give_up(old, error)
                return None
            except AccyError as error:
                failure = error
                if device_lost(error):  # the old daemon, faulted: wait for its successor
                    conn.lose(old, error)
            except ValueError:  # the channel was closed: the client is closing
                return None
            else:
                link = self._new_link(stream, old.generation + 1)
                try:
                    return self._adopt(old, link)
                except AccyError as error:  # that daemon went away too (or is the faulted one)
                    conn.lose(link, error)
                    failure = error
            pause = min(backoff(attempt), max(deadline - time.monotonic(), 0.0))
            if conn.stopping.wait(pause):  # never past the round's end
                return None
            attempt += 1
        self._give_up(old, failure)
        return None

    def _adopt(self, old: Link, link: Link) -> Link:
        """Restore the sessions on ``link`` and make it the client's link; returns it."""
        conn = self._conn
        restarted = link.attachment.instance_id != old.attachment.instance_id
        if not restarted and old.reason == DEVICE_LOST:
            raise Unavailable("the faulted daemon has not restarted yet", reason=DEVICE_LOST)
        restored, lost = conn.sessions.restore(link)
        with conn.cond:
            if restarted:
                old.restarted()
            record = Reattachment(
                number=len(self.history) + 1,
                previous=old.attachment,
                attachment=link.attachment,
                why=old.lost or "",
                restarted=restarted,
                fault_session=old.fault_session,
                sessions_restored=restored,
                sessions_lost=lost,
                buffers_lost=len(old.buffers),
                seconds=time.monotonic() - old.lost_at,
            )
            self.history.append(record)
            conn.publish(link)
        log.info(
            "accy client reattached to %s (%s): %d sessions restored, %d lost, %d buffers lost",
            conn.target,
            record.why,
            restored,
            lost,
            record.buffers_lost,
        )
        if self._on_reattach is not None:
            try:
                self._on_reattach(record)
            except Exception:
                log.exception("the on_reattach callback raised")
        return link

    def _give_up(self, old: Link, error: AccyError | None) -> None:
        """Stop trying: calls raise why, and the next one has it try again (``revive``)."""
        conn = self._conn
        self._gave_up = old
        if not isinstance(error, Unauthenticated | PermissionDenied):
            limit = self.reattach_timeout
            if not limit and limit is not None:
                text = f"lost the daemon at {conn.target} ({old.lost}); reattaching is off"
            else:
                text = (
                    f"lost the daemon at {conn.target} ({old.lost}) and could not attach again "
                    f"within {limit} s"
                )
            error = Unavailable(text + (f": {error}" if error else ""), reason="REATTACH_FAILED")
        conn.give_up(error)
