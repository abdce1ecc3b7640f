"""A client's connection: its channel, the current link, and every call's dispatch.

Errors are translated here, once: a failed call raises its typed ``AccyError``
``from`` the gRPC error. A call made while the client reattaches waits for the
next link, within its own timeout; one made after the client gave up
reattaching has it try again.

After ``fork()`` a connection is the parent's: the child's copy refuses every
call and launch (``ClientClosed``, reason ``CLIENT_FORKED``) and lets go of the
link's ring without writing to it, so the parent's work is never touched.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc

from accy._failures import specific, translate
from accy._link import Link, device_lost, names_client
from accy._rpc import Stub, open_channel
from accy._seam import CLOSE_DRAIN_SECONDS, Transport, WaitRequest
from accy.errors import (
    AccyError,
    ClientClosed,
    DaemonUnreachable,
    DeadlineExceeded,
)

__all__ = ["DEFAULT_WINDOW", "UNSET", "Connection", "Sessions"]

log = logging.getLogger("accy")

_T = TypeVar("_T")
UNSET: Any = object()
"""A timeout argument not given: the connection's default applies."""

DEFAULT_WINDOW = 256
"""Launches sent without waiting that may be not done at once on a ring over a stream."""

LOSS_GRACE = 1.0
"""How long a call that found no daemon waits to learn whether its link was lost (the daemon
went away, so the call waits for the next one) or the daemon is merely out of reach."""


class Sessions:
    """The open sessions, as the functions that load each again on a new link.

    Each is held weakly (a ``WeakMethod``): a session dropped unreleased is not
    restored. A function returns whether the session now works on the link.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys = itertools.count()
        self._movers: dict[int, weakref.WeakMethod[Callable[[Link], bool]]] = {}

    def add(self, mover: Callable[[Link], bool]) -> int:
        """Register a bound method that moves one session to a link; returns its key."""
        with self._lock:
            key = next(self._keys)
            self._movers[key] = weakref.WeakMethod(mover)
        return key

    def discard(self, key: int) -> None:
        with self._lock:
            self._movers.pop(key, None)

    def restore(self, link: Link) -> tuple[int, int]:
        """Load every open session again on ``link``; returns (restored, lost)."""
        with self._lock:
            movers = [ref() for ref in self._movers.values()]
        restored = lost = 0
        for mover in movers:
            if mover is None:
                continue
            if mover(link):
                restored += 1
            else:
                lost += 1
        return restored, lost


def settle(link: Link, timeout: float | None) -> None:
    """Let the launches sent on ``link`` without waiting reach the daemon before another call
    does, as if each had waited to be enqueued (their refusals are reported elsewhere)."""
    link.transport.wait(WaitRequest(None, None, timeout))


class Connection:
    """The channel to one daemon address and the link (attachment) calls go out on.

    Resources (sessions, buffers) hold the connection, not the client, and make
    their calls through ``call``, ``stream_in`` and ``stream_out``.
    """

    def __init__(
        self,
        target: str,
        credentials: grpc.ChannelCredentials | None,
        *,
        server_name: str | None,
        auth: tuple[tuple[str, str], ...],
        has_token: bool,
        timeout: float | None,
        chunk_size: int,
    ) -> None:
        self.target = target
        self.timeout = timeout
        self.chunk_size = chunk_size
        self.shared_memory = True
        """Large transfers to a local daemon go through shared memory (``accy._shm``)."""
        self.transport: Transport | None = None
        """The transport every link uses, where the client was given one
        (``Client(transport=...)``); else each link's is chosen when it is made."""
        self.auth = auth
        self.secure = credentials is not None
        self._has_token = has_token
        self.channel = open_channel(target, credentials, server_name=server_name)
        self.stub = Stub(self.channel)
        self.cond = threading.Condition()
        self.stopping = threading.Event()
        self.closed = False
        self.link: Link | None = None
        """The link calls go out on; ``None`` while the client reattaches."""
        self.last: Link | None = None
        """The latest link, lost or not."""
        self.broken: AccyError | None = None
        """Why the client stopped reattaching: every call raises it."""
        self.sessions = Sessions()
        self.launch_window = DEFAULT_WINDOW
        """Launches sent without waiting that a ring over a stream holds not done at once."""
        self.revive: Callable[[], bool] | None = None
        """Asked by a call once the client gave up reattaching: whether it tries again now."""
        self.pid = os.getpid()
        self.forked = False
        """This is a forked child's copy of the parent's connection."""
        _CONNECTIONS.add(self)
        self._later: collections.deque[Callable[[], object]] = collections.deque()
        self._cleaner: threading.Thread | None = None

    # -- errors ---------------------------------------------------------------------------

    def translate(self, error: grpc.RpcError) -> AccyError:
        """The typed error of a failed call, with what to do about it where the client knows."""
        return translate(error, target=self.target, secure=self.secure, has_token=self._has_token)

    def hint(self, failure: AccyError) -> AccyError:
        """``failure``, made specific: an unreachable daemon, a token refused, a TLS mismatch."""
        return specific(failure, target=self.target, secure=self.secure, has_token=self._has_token)

    def judged(self, failure: AccyError, link: Link) -> AccyError:
        """``failure``, after losing ``link`` if it shows the link gone."""
        if device_lost(failure) or names_client(failure):
            self.lose(link, failure)
        return failure

    # -- the link -------------------------------------------------------------------------

    def check_open(self) -> None:
        if self.closed:
            raise self.closed_error()

    def closed_error(self) -> ClientClosed:
        """Why nothing may be called: the client was closed, or this is a forked child."""
        if self.forked:
            return ClientClosed(
                f"this client of {self.target} was made in process {self.pid} and this is "
                f"process {os.getpid()}, a fork of it: make a new Client after fork()",
                reason="CLIENT_FORKED",
            )
        return ClientClosed(f"the client of {self.target} is closed; make a new Client")

    def forked_child(self) -> None:
        """In a forked child (``os.register_at_fork``): refuse everything from now on, and let
        go of the link's ring without writing to it. Takes no lock: a thread of the parent
        may have held any of them at the fork."""
        self.forked = self.closed = True
        self.link = None
        last = self.last
        if last is not None:
            last.transport.abandon()

    def publish(self, link: Link) -> None:
        """Make ``link`` the one calls go out on (under ``cond``, which callers hold)."""
        self.last = self.link = link
        self.cond.notify_all()

    def lose(self, link: Link, error: AccyError) -> None:
        """``link`` is gone (``error`` says why): calls wait for the next one from now on."""
        with self.cond:
            link.lose(error, time.monotonic())
            if self.link is link:
                self.link = None
            self.cond.notify_all()
        link.stream.cancel()  # its ring stays readable: its error entries say why work failed

    def give_up(self, error: AccyError) -> None:
        """Stop waiting for a link: every call from now on raises ``error``."""
        with self.cond:
            self.broken = error
            self.cond.notify_all()

    def current_link(self, deadline: float | None = None) -> Link:
        """The link to call on: the current one, else wait while the client attaches again
        (until ``deadline``, a ``time.monotonic()`` value; ``None``: as long as it takes)."""
        link = self.link
        if link is not None:
            return link
        self.check_open()  # closed, or a forked child: say so before taking any lock
        revived = False
        with self.cond:
            while True:
                self.check_open()
                if self.link is not None:
                    return self.link
                if self.broken is not None:
                    if revived or self.revive is None or not self.revive():
                        raise self.broken.with_traceback(None)
                    revived = True  # it tries to attach again: wait for that, once
                    continue
                left = 1.0 if deadline is None else min(deadline - time.monotonic(), 1.0)
                if left <= 0:
                    raise DeadlineExceeded(
                        f"the client was attaching again to {self.target} and the call's "
                        "time ran out first"
                    )
                self.cond.wait(left)

    def _lost_soon(self, link: Link, deadline: float | None) -> bool:
        """Wait (briefly) for the attach thread to find ``link`` lost; whether it was."""
        until = time.monotonic() + LOSS_GRACE
        if deadline is not None:
            until = min(until, deadline)
        with self.cond:
            while link.lost is None and not self.closed:
                left = until - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            return link.lost is not None

    # -- calls ----------------------------------------------------------------------------

    def timeout_of(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is UNSET else timeout

    def call(
        self,
        method: grpc.UnaryUnaryMultiCallable[Any, _T],
        request: Any,
        timeout: float | None = UNSET,
        *,
        link: Link | None = None,
    ) -> tuple[_T, Link]:
        """Call one unary RPC on ``link`` (default: the current one); see ``dispatch``."""

        def send(message: Any, use: Link, left: float | None) -> _T:
            settle(use, left)
            return method(message, metadata=use.metadata, timeout=left)

        return self.dispatch(request, send, self.timeout_of(timeout), link, transport=True)

    def unary(
        self,
        method: grpc.UnaryUnaryMultiCallable[Any, _T],
        request: Any,
        timeout: float | None = UNSET,
    ) -> _T:
        """Call one unary RPC on the current link; returns its answer."""
        return self.call(method, request, timeout)[0]

    def dispatch(
        self,
        request: Any,
        send: Callable[[Any, Link, float | None], _T],
        timeout: float | None,
        link: Link | None,
        *,
        transport: bool,
    ) -> tuple[_T, Link]:
        """Send ``request`` on ``link`` (default: the current one); errors come back typed.

        ``request`` is a message, or a function of the link that builds it (ids
        differ between links). On the current link, a request the daemon refused
        because it no longer knew this client did nothing: it is sent once more
        once the client attached again. With ``transport``, so is one that found
        no daemon because the daemon went away (its link is lost), for as long as
        the call's timeout lasts.
        """
        self.check_open()
        deadline = None if timeout is None else time.monotonic() + timeout
        unknown_retried = False
        left = timeout  # the first try has it all; a second, what is left of it
        while True:
            use = link or self.current_link(deadline)
            message = request(use) if callable(request) else request
            cause: BaseException
            try:
                return send(message, use, left), use
            except grpc.RpcError as error:
                failure, cause = self.judged(self.translate(error), use), error
            except AccyError as error:  # raised on the way (ordering after the link's ring)
                failure, cause = self.judged(error, use), error
            if link is None:
                gone = transport and isinstance(failure, DaemonUnreachable)
                again = names_client(failure) and not unknown_retried
                if again or (gone and self._lost_soon(use, deadline)):
                    unknown_retried |= again
                    left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                    continue
            try:  # without them held here, or the error's frames would hold this one in a cycle
                if failure is cause:
                    raise failure
                raise failure from cause
            finally:
                del failure, cause

    def later(self, work: Callable[[], object]) -> None:
        """Run ``work`` soon on a background thread, ignoring its errors (for cleanups that
        must not block or raise where they are noticed, such as in a finalizer)."""
        with self.cond:
            if self.closed:
                return
            self._later.append(work)
            if self._cleaner is None or not self._cleaner.is_alive():
                self._cleaner = threading.Thread(
                    target=self._clean, name="accy-cleanup", daemon=True
                )
                self._cleaner.start()

    def _clean(self) -> None:
        while True:
            with self.cond:
                if not self._later or self.closed:
                    self._later.clear()
                    self._cleaner = None
                    return
                work = self._later.popleft()
            try:
                work()
            except Exception as error:  # best effort: the daemon frees it all on detach
                log.debug("a background cleanup failed: %s", error)

    def stream_in(
        self,
        method: grpc.StreamUnaryMultiCallable[Any, _T],
        requests: Iterator[Any],
        timeout: float | None,
        link: Link,
    ) -> _T:
        """A client-streaming call on ``link`` (a buffer's writes)."""
        self.check_open()
        try:
            settle(link, timeout)
            return method(requests, metadata=link.metadata, timeout=timeout)
        except grpc.RpcError as error:
            raise self.judged(self.translate(error), link) from error

    def stream_out(
        self,
        method: grpc.UnaryStreamMultiCallable[Any, _T],
        request: Any,
        timeout: float | None,
        link: Link,
    ) -> Iterator[_T]:
        """A server-streaming call on ``link`` (a buffer's reads), cancelled when left."""
        self.check_open()
        try:
            settle(link, timeout)
        except AccyError as error:
            raise self.judged(error, link) from None
        call = method(request, metadata=link.metadata, timeout=timeout)
        try:
            yield from call
        except grpc.RpcError as error:
            raise self.judged(self.translate(error), link) from error
        finally:
            call.cancel()

    def close(self) -> None:
        """Stop everything: end the current link and close the channel."""
        if self.forked:
            return  # the channel, the link and their threads are the parent's
        self.stopping.set()
        with self.cond:
            self.closed = True
            self.link = None  # a launch now finds no link, and says the client closed
            link = self.last
            self.cond.notify_all()
        if link is not None:  # first: launches on their way reach the daemon
            link.transport.close(CLOSE_DRAIN_SECONDS if link.lost is None else 0.0)
            link.stream.cancel()
        self.channel.close()


_CONNECTIONS: weakref.WeakSet[Connection] = weakref.WeakSet()
"""Every connection of this process, for the child's side of a fork."""


def _after_fork_in_child() -> None:
    for conn in list(_CONNECTIONS):
        conn.forked_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
