"""Launching from the service: enqueue a LaunchRequest, learn that it finished, answer it.

``Launcher`` serves the unary ``Launch`` (pipelined launches are ring records:
the shared ring, or ``RingStream``) and the one-call ``Run``, and counts each launch
in the metrics once. A waited launch is first polled on the
event loop for a bounded moment (``spin_seconds``, about 100 µs: a small launch
is over by then, and answering it costs no thread hop); one still running
learns of its end from the backend's notification (a host function on the
session's stream calls back onto the event loop), and past a short patience
awaits it through the core (``wait_launch_async``), so neither the event loop
nor a thread waits on the device for longer than the spin. A launch that needs
scratch of its own (an allocation) is enqueued on the device-work threads,
within its client's share. ``until_stopped`` ends a stream's requests (a
``RingStream``'s frames) when the server stops.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator
from typing import TypeVar

from accy.protocol.launch.v1 import launch_pb2 as pb
from accyd.core.interface import UNKNOWN_PIPELINE, Core, LaunchTicket, WouldBlock
from accyd.doors.grpc import convert
from accyd.doors.grpc.calls import CallTracker, id_fields, text_field
from accyd.logs import bind
from accyd.telemetry.metrics import Metrics
from accyd.tokens import Principal

__all__ = ["NOTIFY_PATIENCE_SECONDS", "Launcher", "until_stopped"]

_Message = TypeVar("_Message")

NOTIFY_PATIENCE_SECONDS = 0.005
"""How long a waiting launch relies on its own notification before the core's awaited wait."""


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
        self, daemon: Core, calls: CallTracker, metrics: Metrics, *, spin_seconds: float = 0.0
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

    async def run(
        self, request: pb.RunRequest, client_id: str | None, principal: Principal, started: float
    ) -> pb.RunResponse:
        """The one-call path (``Daemon.run``) on the device-work threads, within the caller's
        share (an unattached caller's is its tenant's); its launch counted as a waited one."""
        target = text_field(request.target, "target")
        fmt = convert.format_from_proto(text_field(request.format, "format", required=False))
        operands = [
            convert.tensor_from_proto(tensor, f"operands[{index}]")
            for index, tensor in enumerate(request.operands)
        ]
        scalars = convert.scalars_from_proto(request.runtime_scalars)
        try:
            results = await self.calls.blocking_for(
                client_id or principal.tenant,
                functools.partial(
                    self.daemon.run,
                    client_id,
                    target,
                    request.version,
                    fmt,
                    operands,
                    scalars,
                    tenant=principal.tenant,
                    quotas=principal.quotas,
                ),
            )
        except Exception as error:
            # The label is bounded: a target outside the catalog is counted as unknown.
            known = any(pipeline.target == target for pipeline in self.daemon.pipelines())
            label = target if known else UNKNOWN_PIPELINE
            self.metrics.observe_launch(label, 0.0, waited=True, error=error)
            raise
        elapsed = time.perf_counter() - started
        self.metrics.observe_launch(target, elapsed, waited=True)
        return pb.RunResponse(
            results=[convert.tensor_to_proto(result) for result in results],
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


async def until_stopped(requests: AsyncIterator[_Message], daemon: Core) -> AsyncIterator[_Message]:
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
