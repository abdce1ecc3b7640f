"""Launching from the service: enqueue a LaunchRequest, learn that it finished, answer it.

``Launcher`` serves both the unary ``Launch`` and ``LaunchStream``. A waited
launch is first polled on the event loop for a bounded moment (``spin_seconds``,
about 100 µs: a small launch is over by then, and answering it costs no thread
hop); one still running learns of its end from the backend's notification (a
host function on the session's stream calls back onto the event loop), and
past a short patience awaits it through the core (``wait_launch_async``), so
neither the event loop nor a thread waits on the device for longer than the
spin. A launch that needs scratch of its own (an allocation) is enqueued on the
device-work threads, within its client's share.

On a stream, each request is validated and enqueued as it is read, so one
session's launches keep the stream's order; a waited one is answered by a task
of its own when it finishes, while the stream reads on (one already over after
the spin is answered at once, without a task). A refused launch is
answered in-band with the ``google.rpc.Status`` a unary call would have failed
with. A message may carry more launches (``LaunchRequest.more``, what a client
had ready at once); the answers ready when its last one is taken go back as one
message (``LaunchStreamResponse.more``): one read and one write for many
launches, which is what a pipelined remote client is limited by.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Iterator
from typing import TypeVar

import structlog

from accy.protocol.launch.v1 import launch_pb2 as pb
from accyd.core.daemon import Daemon, LaunchTicket, WouldBlock
from accyd.core.ids import new_request_id
from accyd.errors import InvalidRequest
from accyd.logs import bind
from accyd.metrics import Metrics
from accyd.service import convert
from accyd.service.calls import CallTracker, Context, id_fields, log_failure, text_field
from accyd.service.errors import to_rpc_status
from accyd.service.tasks import TaskSet

__all__ = ["NOTIFY_PATIENCE_SECONDS", "Launcher", "until_stopped"]

log = structlog.get_logger("accyd.service")

_Message = TypeVar("_Message")

NOTIFY_PATIENCE_SECONDS = 0.005
"""How long a waiting launch relies on its own notification before the core's awaited wait."""

_LAUNCH = "Launch"
"""Each launch of a stream counts as a call in flight (graceful shutdown waits for it)."""


def _resolve_soon(future: asyncio.Future[bool]) -> None:
    """From any thread: the launch finished; resolve ``future`` with True on its loop."""
    future.get_loop().call_soon_threadsafe(_resolve, future, True)


def _resolve(future: asyncio.Future[bool], finished: bool) -> None:
    if not future.done():
        future.set_result(finished)


class _Pending:
    """An enqueued launch on its way to an answer."""

    __slots__ = ("enqueued", "finished", "settled", "started", "ticket", "wait")

    def __init__(self, ticket: LaunchTicket, started: float, enqueued: float, wait: bool) -> None:
        self.ticket = ticket
        self.started = started
        self.enqueued = enqueued
        self.wait = wait or ticket.must_wait
        self.settled = False
        """Over already (polled on the loop): the wait only reports errors."""
        self.finished: asyncio.Future[bool] | None = None
        """Resolved True by the backend's notification, False when its patience ran out."""


class Launcher:
    """Validates and enqueues launches on the daemon and answers them when due."""

    def __init__(
        self, daemon: Daemon, calls: CallTracker, metrics: Metrics, *, spin_seconds: float = 0.0
    ) -> None:
        self.daemon = daemon
        self.calls = calls
        self.metrics = metrics
        self.spin_seconds = spin_seconds

    async def submit(self, client_id: str, request: pb.LaunchRequest, started: float) -> _Pending:
        """``enqueue``, or, for a launch that must allocate, ``enqueue`` off the event loop."""
        try:
            return self.enqueue(client_id, request, started)
        except WouldBlock:
            return await self.calls.blocking_for(
                client_id, self.enqueue, client_id, request, started, may_block=True
            )

    def enqueue(
        self, client_id: str, request: pb.LaunchRequest, started: float, *, may_block: bool = False
    ) -> _Pending:
        """Check ``request`` and enqueue it on its session's stream.

        A waited launch is polled for at most ``spin_seconds`` here, and if it
        still runs, the backend is asked to call back when it is over: both
        before any other work can be queued behind it. A launch that would
        allocate raises ``WouldBlock`` unless ``may_block`` (off the event loop).
        """
        session_id = text_field(request.session_id, "session_id")
        bind(session_id=session_id)
        try:
            operands = id_fields(request.operands, "operands")
            results = id_fields(request.results, "results")
            scalars = convert.scalars_from_proto(request.runtime_scalars)
            ticket = self.daemon.launch(
                client_id,
                session_id,
                operands,
                results,
                scalars,
                watch=request.wait,
                may_block=may_block,
            )
        except WouldBlock:
            raise
        except Exception as error:
            self._count_failure(client_id, session_id, request.wait, error)
            raise
        pending = _Pending(ticket, started, time.perf_counter() - started, request.wait)
        watch = ticket.watch
        if watch is not None:
            try:
                pending.settled = watch.settle(self.spin_seconds)
                if not pending.settled:
                    finished = asyncio.get_running_loop().create_future()
                    if watch.notify(functools.partial(_resolve_soon, finished)):
                        pending.finished = finished
            finally:
                watch.close()
        return pending

    async def finish(
        self, client_id: str, pending: _Pending, *, reap: bool = True
    ) -> pb.LaunchResponse:
        """Wait for the launch if it is to be waited for; its answer.

        With ``reap`` false the caller drops the finished launch from its
        session's log (``Daemon.reap``) once it has answered.
        """
        ticket = pending.ticket
        if pending.wait:
            try:
                await self._wait(client_id, pending, reap)
            except Exception as error:
                self._count_failure(client_id, ticket.session_id, True, error)
                raise
        elapsed = time.perf_counter() - pending.started
        self.metrics.observe_launch(ticket.pipeline, elapsed, waited=pending.wait)
        return pb.LaunchResponse(
            launch_id=ticket.launch_id,
            completed=pending.wait,
            enqueue_seconds=pending.enqueued,
            elapsed_seconds=elapsed,
        )

    def _count_failure(self, client_id: str, session_id: str, wait: bool, error: Exception) -> None:
        pipeline = self.daemon.pipeline_of(client_id, session_id)
        self.metrics.observe_launch(pipeline, 0.0, waited=wait, error=error)

    async def _wait(self, client_id: str, pending: _Pending, reap: bool) -> None:
        """Wait for a launch: over already, or notified soon, or else awaited through the core.

        The launch's own notification saves the core's bookkeeping for short
        kernels; the core's wait (notified too, and polled for a lost device)
        serves long kernels. Neither holds a thread.
        """
        session_id, launch_id = pending.ticket.session_id, pending.ticket.launch_id
        finished = pending.finished
        if not pending.settled and finished is not None:
            # A timer resolves the same future with False: no task, no shield, one wake-up.
            timer = finished.get_loop().call_later(
                NOTIFY_PATIENCE_SECONDS, _resolve, finished, False
            )
            try:
                pending.settled = await finished
            finally:
                timer.cancel()
        if pending.settled:
            # Over: this wait returns at once and reports any error.
            self.daemon.wait_launch(client_id, session_id, launch_id, reap=reap)
            return
        await self.daemon.wait_launch_async(client_id, session_id, launch_id)

    # LaunchStream -----------------------------------------------------------------

    async def stream(
        self, client_id: str, requests: AsyncIterator[pb.LaunchRequest], context: Context
    ) -> None:
        """Serve one LaunchStream until the client stops sending and every answer is out.

        Each message may carry more launches (``more``): they are handled in order, and
        the answers ready by the end of a message go out together, as one message.
        """
        answers = _Answers(context)
        finishing = TaskSet()
        try:
            async for message in until_stopped(requests, self.daemon):
                ready: list[pb.LaunchStreamResponse] = []
                reap: list[str] = []
                for request, nested in _launches_in(message):
                    if nested:
                        ready.append(_refusal(request.tag, NESTED))
                        continue
                    answer = await self._take(client_id, request, answers, finishing, ready, reap)
                    if answer is not None:
                        ready.append(answer)
                await answers.send_all(ready)
                for session_id in reap:  # after the answers: tidying only
                    self.daemon.reap(client_id, session_id)
            await finishing.settle()  # the client is done sending: answer what still runs
        finally:
            finishing.cancel()

    async def _take(
        self,
        client_id: str,
        request: pb.LaunchRequest,
        answers: _Answers,
        finishing: TaskSet,
        ready: list[pb.LaunchStreamResponse],
        reap: list[str],
    ) -> pb.LaunchStreamResponse | None:
        """One launch of a message: its answer if it is ready now; else one task answers it."""
        if request.ping:
            return pb.LaunchStreamResponse(tag=request.tag)
        started = time.perf_counter()
        self.calls.enter(_LAUNCH)
        try:
            try:
                pending = self.enqueue(client_id, request, started)
            except WouldBlock:  # in order: the stream reads on once it is enqueued
                await answers.send_all(ready)  # those ready need not wait for an allocation
                ready.clear()
                pending = await self.calls.blocking_for(
                    client_id, self.enqueue, client_id, request, started, may_block=True
                )
        except Exception as error:
            self.calls.leave(_LAUNCH)
            return _refusal(request.tag, error)
        if pending.wait and not pending.settled:
            finishing.start(self._answer(client_id, request.tag, pending, answers))
            return None
        try:  # enqueued, or over already: answered with the message's others, without a task
            response = await self.finish(client_id, pending, reap=False)
        except Exception as error:
            return _refusal(request.tag, error)
        finally:
            self.calls.leave(_LAUNCH)
        if pending.wait:
            reap.append(pending.ticket.session_id)
        return pb.LaunchStreamResponse(tag=request.tag, launch=response)

    async def _answer_now(
        self, client_id: str, tag: int, pending: _Pending, answers: _Answers
    ) -> None:
        """Finish the launch and send its answer, or why it failed; then tidy its session."""
        try:
            response = await self.finish(client_id, pending, reap=False)
        except Exception as error:
            await answers.refuse(tag, error)
        else:
            await answers.send(tag, response)
        if pending.wait:
            self.daemon.reap(client_id, pending.ticket.session_id)

    async def _answer(self, client_id: str, tag: int, pending: _Pending, answers: _Answers) -> None:
        try:
            await self._answer_now(client_id, tag, pending, answers)
        except asyncio.CancelledError:
            raise
        except Exception:  # the stream is gone (cancelled or broken): nobody to answer
            log.debug("launch answer not sent", tag=tag)
        finally:
            self.calls.leave(_LAUNCH)


def _launches_in(message: pb.LaunchRequest) -> Iterator[tuple[pb.LaunchRequest, bool]]:
    """``(launch, nested)``: the message's launch, then those in its ``more``; ``nested``
    marks one in ``more`` with a ``more`` of its own (refused: one level only)."""
    yield message, False
    for request in message.more:
        yield request, bool(request.more)


NESTED = InvalidRequest(
    "a launch in `more` carries `more` of its own: put every launch of a message in the "
    "first one's `more`",
    field="more",
)


async def until_stopped(
    requests: AsyncIterator[_Message], daemon: Daemon
) -> AsyncIterator[_Message]:
    """The stream's requests; a read that fails because the server is stopping ends them."""
    iterator = aiter(requests)
    while True:
        try:
            request = await anext(iterator)
        except StopAsyncIteration:
            return
        except Exception:
            if daemon.serving:
                raise
            return  # the server stopped under the stream: nothing more will come
        yield request


class _Answers:
    """Writes a stream's answers one at a time (several tasks answer the same stream)."""

    def __init__(self, context: Context) -> None:
        self._context = context
        self._lock = asyncio.Lock()

    async def pong(self, tag: int) -> None:
        await self._write(pb.LaunchStreamResponse(tag=tag))

    async def send(self, tag: int, response: pb.LaunchResponse) -> None:
        await self._write(pb.LaunchStreamResponse(tag=tag, launch=response))

    async def refuse(self, tag: int, error: Exception) -> None:
        await self._write(_refusal(tag, error))

    async def send_all(self, ready: list[pb.LaunchStreamResponse]) -> None:
        """Send the answers ``ready`` as one message: the first, the others in its ``more``."""
        if not ready:
            return
        first = ready[0]
        if len(ready) > 1:
            first.more.extend(ready[1:])
        await self._write(first)

    async def _write(self, message: pb.LaunchStreamResponse) -> None:
        async with self._lock:
            await self._context.write(message)


def _refusal(tag: int, error: Exception) -> pb.LaunchStreamResponse:
    """The answer for a launch refused with ``error`` (logged, with a request id)."""
    request_id = new_request_id()
    log_failure("launch", error, tag=tag, request_id=request_id)
    return pb.LaunchStreamResponse(tag=tag, error=to_rpc_status(error, request_id))
