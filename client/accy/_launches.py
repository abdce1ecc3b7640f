"""One LaunchStream call: launches go out as messages, each answer comes back to its caller."""

from __future__ import annotations

import copy
import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, NoReturn

import grpc

from accy._rpc import Stub
from accy._waiters import Sent, Waiter
from accy.errors import AccyError, Cancelled, DeadlineExceeded, Unavailable, from_rpc_status
from accy.protocol.launch.v1 import launch_pb2 as pb

if TYPE_CHECKING:
    from grpc import _CallIterator

__all__ = ["DEFAULT_WINDOW", "LaunchStream", "Sent"]

_END = None
STALL_SECONDS = 2.0
"""How long a ping may go unanswered, once a launch passed its timeout, before the stream
is taken for dead and cancelled."""
LOST_ANSWER_SECONDS = 1.0
"""How long answers already on their way may still arrive on an abandoned stream."""
DEFAULT_WINDOW = 256
"""Launches sent without waiting that may be unanswered at once on one stream."""
BATCH_MOST = 255
"""Launches queued behind one that go out in its message (``LaunchRequest.more``)."""
CLOSE_DRAIN_SECONDS = 10.0
"""How long closing the client waits for the answers to launches it sent without waiting."""


class LaunchStream:
    """An open LaunchStream on one link; ``launch()`` is safe from any thread.

    Launching on a stream skips a unary call's per-call setup on both sides,
    about half its cost. The Client opens one per link (it carries the link's
    client id) the first time a session launches, and closes it with the link.

    Requests are tagged. A caller waiting for its answer reads the stream
    itself while no other caller does (leader and followers), and hands each
    answer to the caller it belongs to, so a lone caller's answer costs no
    thread hop. A launch sent without waiting (``send``) returns once written;
    at most ``window`` of them are unanswered at once (the sender blocks), and
    a collector thread reads their answers while they are due and no caller
    reads. A refusal among them is raised by the session's next launch or
    ``settle`` (CUDA's asynchronous errors), naming the launch.

    A caller that stops waiting (its timeout) leaves its launch on the daemon,
    as a unary call's deadline does: a watchdog thread, started by the first
    launch with a timeout, pings the daemon so that a caller blocked reading
    wakes up on time, and cancels the stream if the daemon does not answer
    the ping within ``STALL_SECONDS``.
    """

    def __init__(
        self,
        stub: Stub,
        metadata: Sequence[tuple[str, str]],
        translate: Callable[[grpc.RpcError], AccyError],
        hint: Callable[[AccyError], AccyError],
        window: int = DEFAULT_WINDOW,
    ) -> None:
        self.window = window
        """Launches sent without waiting that may be unanswered at once (senders block)."""
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
        self._waiting: dict[int, Waiter] = {}
        self._reading = False
        self._failure: AccyError | None = None
        self._abandoned: Callable[[], AccyError] | None = None
        """Set by ``abandon``: why launches that get no answer failed, asked when they do."""
        self._watchdog: threading.Thread | None = None
        self._unanswered = 0
        """Launches sent without waiting whose answers have not come yet."""
        self._faults: dict[str, list[Sent]] = {}
        """Per session, refused launches sent without waiting, not reported yet."""
        self._collector: threading.Thread | None = None
        self._outbox: queue.SimpleQueue[pb.LaunchRequest | None] = queue.SimpleQueue()
        self._call: _CallIterator[pb.LaunchStreamResponse] = stub.LaunchStream(
            self._requests(), metadata=tuple(metadata)
        )

    @property
    def broken(self) -> bool:
        """Whether the stream ended: launches need a new one."""
        return self._failure is not None or self._abandoned is not None

    def launch(self, request: pb.LaunchRequest, timeout: float | None) -> pb.LaunchResponse:
        """Send ``request`` and block for its answer; a refusal raises its typed error.

        An earlier launch of the same session sent without waiting that was
        refused raises first, and ``request`` is not sent.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        waiter = Waiter(deadline)
        with self._lock:
            self._check(request.session_id)
            tag = next(self._tags)
            request.tag = tag
            self._waiting[tag] = waiter
            self._outbox.put(request)
            if deadline is not None:
                self._watch(deadline)
        try:
            self._await(waiter, deadline)
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

    def send(self, request: pb.LaunchRequest, timeout: float | None) -> Sent:
        """Send ``request`` without waiting for its answer; block only while the window is full.

        An earlier refused launch of the same session raises first, as ``launch``.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._check(request.session_id)
            while self._unanswered >= self.window:
                remaining = _remaining(deadline)
                if remaining is not None and remaining <= 0:
                    raise DeadlineExceeded(
                        f"{self._unanswered} launches were still unanswered after {timeout} s; "
                        f"the launch on session {request.session_id} was not sent"
                    )
                self._changed.wait(remaining)
                self._check(request.session_id)
            sent = Sent(self, next(self._tags), request.session_id)
            request.tag = sent.tag
            self._waiting[sent.tag] = sent
            self._unanswered += 1
            self._outbox.put(request)
            if self._collector is None:
                self._collector = threading.Thread(
                    target=self._collect, name="accy-launch-answers", daemon=True
                )
                self._collector.start()
            elif self._unanswered == 1:
                self._changed.notify_all()  # the collector sleeps while nothing is unanswered
        return sent

    def answer(self, sent: Sent, timeout: float | None) -> pb.LaunchResponse:
        """``sent``'s answer, once it came (within ``timeout``); its refusal raises, once."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._await(sent, deadline)
        with self._lock:
            if sent.answer is not None:
                return sent.answer
            if sent.error is None:
                raise DeadlineExceeded(f"no answer to {sent.name()} within {timeout} s")
            return self._report(sent, None)

    def settle(self, session_id: str | None, timeout: float | None) -> None:
        """Wait for the answers to every launch sent so far (of ``session_id``; ``None``: all).

        Then a refused one of ``session_id`` raises, naming it. Calls after this
        reach the daemon after those launches were enqueued.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            if not self._unanswered and (session_id is None or session_id not in self._faults):
                return
            sent = [
                waiter
                for waiter in self._waiting.values()
                if isinstance(waiter, Sent) and session_id in (None, waiter.session_id)
            ]
        for waiter in sent:
            self._await(waiter, deadline)
            if not waiter.done:
                raise DeadlineExceeded(
                    f"{waiter.name()} got no answer within {timeout} s; it may still be on its way"
                )
        if session_id is not None:
            with self._lock:
                self._check(session_id, None)

    def _check(self, session_id: str, then: str | None = "this launch was not sent") -> None:
        """(Under the lock.) Raise why the stream ended, or ``session_id``'s first refusal."""
        if self._failure is not None:
            raise self._failure.with_traceback(None)
        if self._abandoned is not None:
            raise self._abandoned()
        faults = self._faults.get(session_id)
        if faults:
            self._report(faults[0], then)

    def _report(self, sent: Sent, then: str | None) -> NoReturn:
        """(Under the lock.) Raise ``sent``'s refusal, naming it; it is not reported again."""
        error = sent.error
        assert error is not None
        if error is self._failure:  # the stream ended before its answer came
            raise error.with_traceback(None)
        faults = self._faults.get(sent.session_id, [])
        if sent in faults:
            faults.remove(sent)
            if not faults:
                del self._faults[sent.session_id]
        if not sent.reported:
            sent.reported = True
            error.message = f"{sent.name()} was refused: {error.message}"
            error.args = (error.message,)
            error.metadata.setdefault("launch", f"#{sent.tag}")
        notes = [f"{len(faults)} later ones were refused too"] if faults else []
        notes += [then] if then else []
        if notes:  # for this call only: the launch's own wait() raises the plain refusal
            raised = copy.copy(error)
            raised.metadata = dict(error.metadata)
            raised.message = "; ".join([error.message, *notes])
            raised.args = (raised.message,)
            raise raised.with_traceback(None)
        raise error.with_traceback(None)

    def close(self, drain: float = 0.0) -> None:
        """End the stream; launches still waiting raise ``Cancelled``; idempotent.

        With ``drain``, first wait up to that many seconds for the answers to
        launches sent without waiting: those launches are on the daemon then.
        """
        if drain > 0:
            until = time.monotonic() + drain
            with self._lock:
                while self._unanswered and self._failure is None and self._abandoned is None:
                    left = until - time.monotonic()
                    if left <= 0:
                        break
                    self._changed.wait(left)
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

    def _await(self, waiter: Waiter, deadline: float | None) -> None:
        """Return once ``waiter`` is answered or past ``deadline``, reading answers meanwhile."""
        while True:
            with self._lock:
                while True:
                    if waiter.done:
                        return
                    remaining = _remaining(deadline)
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
            self._take(answer)
            for more in answer.more:
                self._take(more)

    def _take(self, answer: pb.LaunchStreamResponse) -> None:
        """(Under the lock.) Give one answer to its waiter."""
        waiter = self._waiting.get(answer.tag)
        if waiter is None:  # a ping's answer, or its caller gave up waiting
            return
        outcome = answer.WhichOneof("outcome")
        if outcome == "launch":
            waiter.answer = answer.launch
        elif outcome == "error":
            waiter.error = self._hint(from_rpc_status(answer.error))
        if isinstance(waiter, Sent):  # nobody blocks on it: keep a refusal for later
            del self._waiting[answer.tag]
            self._unanswered -= 1
            if waiter.error is not None:
                self._faults.setdefault(waiter.session_id, []).append(waiter)

    def _collect(self) -> None:
        """The collector thread: read answers while launches sent without waiting lack theirs.

        It reads only while no caller does, so that a lone waited launch still
        reads its own answer without a thread hop.
        """
        while True:
            with self._lock:
                while self._reading or not self._unanswered:
                    if self._failure is not None:
                        return
                    self._changed.wait()
                if self._failure is not None:
                    return
                self._reading = True
            try:
                self._read_one()
            finally:
                with self._lock:
                    self._reading = False
                    self._changed.notify_all()

    def _requests(self) -> Iterator[pb.LaunchRequest]:
        """The messages to send: each launch, with those queued behind it in its ``more``
        (up to ``BATCH_MOST``), so launches made faster than messages go out share one."""
        outbox = self._outbox
        while (request := outbox.get()) is not _END:
            batch: list[pb.LaunchRequest] = []
            ended = False
            while len(batch) < BATCH_MOST:
                try:
                    more = outbox.get_nowait()
                except queue.Empty:
                    break
                if more is _END:
                    ended = True
                    break
                batch.append(more)
            if batch:
                request.more.extend(batch)
            yield request
            if ended:
                return

    def _fail(self, error: AccyError) -> None:
        """Fail every launch waiting with ``error``, and every later one (the first error wins)."""
        with self._lock:
            if self._failure is None:
                self._failure = error
                for tag, waiter in list(self._waiting.items()):
                    if isinstance(waiter, Sent) and not waiter.done:  # later calls raise it
                        waiter.error = error
                        del self._waiting[tag]
                self._unanswered = 0
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
