"""One LaunchStream call: launches go out as messages, each answer comes back to its caller."""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import grpc

from accy._rpc import Stub
from accy.errors import AccyError, Cancelled, DeadlineExceeded, Unavailable, from_rpc_status
from accy.protocol.launch.v1 import launch_pb2 as pb

if TYPE_CHECKING:
    from grpc import _CallIterator

__all__ = ["LaunchStream"]

_END = None
STALL_SECONDS = 2.0
"""How long a ping may go unanswered, once a launch passed its timeout, before the stream
is taken for dead and cancelled."""
LOST_ANSWER_SECONDS = 1.0
"""How long answers already on their way may still arrive on an abandoned stream."""


class _Waiter:
    """One launch waiting for its answer."""

    __slots__ = ("answer", "deadline", "error")

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline
        self.answer: pb.LaunchResponse | None = None
        self.error: AccyError | None = None

    @property
    def done(self) -> bool:
        return self.answer is not None or self.error is not None


class LaunchStream:
    """An open LaunchStream on one link; ``launch()`` is safe from any thread.

    Launching on a stream skips a unary call's per-call setup on both sides,
    about half its cost. The Client opens one per link (it carries the link's
    client id) the first time a session launches, and closes it with the link.

    Requests are tagged. There is no reader thread: a caller waiting for its
    answer reads the stream itself while no other caller does (leader and
    followers), and hands each answer to the caller it belongs to, so a lone
    caller's answer costs no thread hop. A caller that stops waiting (its
    timeout) leaves its launch on the daemon, as a unary call's deadline does:
    a watchdog thread, started by the first launch with a timeout, pings the
    daemon so that a caller blocked reading wakes up on time, and cancels the
    stream if the daemon does not answer the ping within ``STALL_SECONDS``.
    """

    def __init__(
        self,
        stub: Stub,
        metadata: Sequence[tuple[str, str]],
        translate: Callable[[grpc.RpcError], AccyError],
        hint: Callable[[AccyError], AccyError],
    ) -> None:
        self._translate = translate
        self._hint = hint
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        """Notified when an answer arrives or the reader steps down (waiters wait on it)."""
        self._alarm = threading.Condition(self._lock)
        """Notified when the watchdog must look again: an earlier deadline, or the end."""
        self._alarm_at: float | None = None
        """When the watchdog means to wake next (``None``: only when notified)."""
        self._tags = itertools.count(1)
        self._waiting: dict[int, _Waiter] = {}
        self._reading = False
        self._failure: AccyError | None = None
        self._abandoned: Callable[[], AccyError] | None = None
        """Set by ``abandon``: why launches that get no answer failed, asked when they do."""
        self._watchdog: threading.Thread | None = None
        self._outbox: queue.SimpleQueue[pb.LaunchRequest | None] = queue.SimpleQueue()
        self._call: _CallIterator[pb.LaunchStreamResponse] = stub.LaunchStream(
            self._requests(), metadata=tuple(metadata)
        )

    @property
    def broken(self) -> bool:
        """Whether the stream ended: launches need a new one."""
        return self._failure is not None or self._abandoned is not None

    def launch(self, request: pb.LaunchRequest, timeout: float | None) -> pb.LaunchResponse:
        """Send ``request`` and block for its answer; a refusal raises its typed error."""
        deadline = None if timeout is None else time.monotonic() + timeout
        waiter = _Waiter(deadline)
        with self._lock:
            if self._failure is not None:
                raise self._failure.with_traceback(None)
            if self._abandoned is not None:
                raise self._abandoned()
            tag = next(self._tags)
            request.tag = tag
            self._waiting[tag] = waiter
            self._outbox.put(request)
            if deadline is not None:
                self._watch(deadline)
        try:
            self._await(waiter)
        finally:
            with self._lock:
                self._waiting.pop(tag, None)
        if waiter.error is not None:
            raise waiter.error.with_traceback(None)
        if waiter.answer is None:
            raise DeadlineExceeded(
                f"no answer to the launch on session {request.session_id} within {timeout} s; "
                "it may still run (wait on the session to be sure)"
            )
        return waiter.answer

    def close(self) -> None:
        """End the stream now; launches still waiting raise ``Cancelled``; idempotent."""
        self._fail(Cancelled("the client closed its launch stream"))
        self._outbox.put(_END)
        self._call.cancel()

    def abandon(self, why: Callable[[], AccyError], grace: float = LOST_ANSWER_SECONDS) -> None:
        """Send nothing more, but take answers already on their way for ``grace`` seconds.

        For a lost link: a daemon that is stopping, or that detached the client,
        may have answered launches in flight (a device fault naming the session
        that caused it, say) just before its Attach stream ended; those answers
        still reach their callers. The daemon answers what it has and ends the
        half-closed stream; after ``grace`` it is cancelled. Launches left
        without an answer, and new ones, raise ``why()``, asked only then: by
        that time the link may know better why it was lost. Idempotent.
        """
        with self._lock:
            if self._failure is not None or self._abandoned is not None:
                return
            self._abandoned = why
        self._outbox.put(_END)
        timer = threading.Timer(grace, self._end_abandoned)
        timer.daemon = True
        timer.start()

    def _end_abandoned(self) -> None:
        assert self._abandoned is not None
        self._fail(self._abandoned())
        self._call.cancel()

    def _ended(self, error: AccyError) -> AccyError:
        """Why launches fail now that the stream ended with ``error``."""
        return self._abandoned() if self._abandoned is not None else error

    def _await(self, waiter: _Waiter) -> None:
        """Return once ``waiter`` is answered or past its deadline, reading answers meanwhile."""
        while True:
            with self._lock:
                while True:
                    if waiter.done:
                        return
                    remaining = _remaining(waiter.deadline)
                    if remaining is not None and remaining <= 0:
                        return  # past its deadline, whatever became of the stream
                    if self._failure is not None:
                        waiter.error = self._failure
                        return
                    if not self._reading:
                        self._reading = True
                        break
                    self._changed.wait(remaining)
            try:
                self._read_one()
            finally:
                with self._lock:
                    self._reading = False
                    self._changed.notify_all()

    def _read_one(self) -> None:
        """Read one answer (outside the lock) and give it to its waiter."""
        try:
            answer = next(self._call)
        except StopIteration:
            self._fail(self._ended(Unavailable("the daemon ended the launch stream")))
            return
        except grpc.RpcError as error:
            self._fail(self._ended(self._translate(error)))
            return
        with self._lock:
            waiter = self._waiting.get(answer.tag)
            if waiter is None:  # a ping's answer, or its caller gave up waiting
                return
            outcome = answer.WhichOneof("outcome")
            if outcome == "launch":
                waiter.answer = answer.launch
            elif outcome == "error":
                waiter.error = self._hint(from_rpc_status(answer.error))

    def _requests(self) -> Iterator[pb.LaunchRequest]:
        while (request := self._outbox.get()) is not _END:
            yield request

    def _fail(self, error: AccyError) -> None:
        """Fail every launch waiting with ``error``, and every later one (the first error wins)."""
        with self._lock:
            if self._failure is None:
                self._failure = error
            self._changed.notify_all()
            self._alarm.notify_all()

    # -- timeouts ---------------------------------------------------------------------

    def _watch(self, deadline: float) -> None:
        """(Under the lock.) Start the watchdog, or wake it for a deadline earlier than its plan."""
        if self._watchdog is None:
            self._watchdog = threading.Thread(
                target=self._guard, name="accy-launch-watchdog", daemon=True
            )
            self._watchdog.start()
        elif self._alarm_at is None or deadline < self._alarm_at:
            self._alarm.notify_all()

    def _guard(self) -> None:
        """The watchdog: wake a blocked reader whose caller's deadline passed."""
        pinged_at: float | None = None
        with self._lock:
            while self._failure is None:
                now = time.monotonic()
                deadlines = [w.deadline for w in self._waiting.values() if w.deadline is not None]
                if not (self._reading and any(d <= now for d in deadlines)):
                    pinged_at = None
                    upcoming = [d for d in deadlines if d > now]
                    self._alarm_at = min(upcoming) if upcoming else None
                    self._alarm.wait(None if self._alarm_at is None else self._alarm_at - now)
                    continue
                # A caller's time is up while a reader blocks: a ping's answer wakes it.
                if pinged_at is None:
                    pinged_at = now
                    self._outbox.put(pb.LaunchRequest(tag=next(self._tags), ping=True))
                elif now - pinged_at > STALL_SECONDS:
                    self._failure = Unavailable(
                        f"the daemon did not answer on the launch stream for {STALL_SECONDS} s"
                    )
                    self._changed.notify_all()
                    self._call.cancel()
                    return
                self._alarm_at = now + 0.05
                self._alarm.wait(0.05)


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else deadline - time.monotonic()
