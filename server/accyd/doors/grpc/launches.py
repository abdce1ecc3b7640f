"""Launching from the service: enqueue a LaunchRequest, learn that it finished, answer it.

``Launcher`` serves the unary ``Launch`` (pipelined launches are ring records:
the shared ring, or ``RingStream``) and the one-call ``Run``, and counts each launch
in the metrics once. A launch goes through ``accyd.scheduling``: ``launched`` (one
that needs scratch of its own is enqueued on the device-work threads, within its
client's share) and, when waited for, ``LaunchEnd`` (polled for ``spin_seconds``,
then the backend's notification, then the core's wait), so neither the event loop
nor a thread waits on the device for longer than the spin. ``until_stopped`` ends a
stream's requests (a ``RingStream``'s frames) when the server stops.
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator
from typing import TypeVar

from accy.protocol.launch.v1 import launch_pb2 as pb
from accyd.core.interface import UNKNOWN_PIPELINE, Core, LaunchTicket
from accyd.doors.grpc import convert
from accyd.doors.grpc.calls import id_fields, text_field
from accyd.logs import bind
from accyd.scheduling import DeviceWork, LaunchEnd, launched
from accyd.telemetry.metrics import Metrics
from accyd.tokens import Principal

__all__ = ["Launcher", "until_stopped"]

_Message = TypeVar("_Message")


class _Pending:
    """An enqueued launch on its way to an answer."""

    __slots__ = ("end", "enqueued", "started", "ticket")

    def __init__(
        self, ticket: LaunchTicket, started: float, enqueued: float, end: LaunchEnd | None
    ) -> None:
        self.ticket = ticket
        self.started = started
        self.enqueued = enqueued
        self.end = end
        """Where it is waited for (a waited launch, or one on scratch of its own)."""


class Launcher:
    """Validates and enqueues launches on the daemon and answers them when due."""

    def __init__(
        self, daemon: Core, work: DeviceWork, metrics: Metrics, *, spin_seconds: float = 0.0
    ) -> None:
        self.daemon = daemon
        self.work = work
        self.metrics = metrics
        self.spin_seconds = spin_seconds

    async def submit(self, client_id: str, request: pb.LaunchRequest, started: float) -> _Pending:
        """Check ``request`` and enqueue it on its session's stream (off the event loop, within
        the client's share, if it must allocate).

        A waited launch is polled for at most ``spin_seconds`` here, and if it still runs,
        the backend is asked to call back when it is over: both before any other work can
        be queued behind it.
        """
        session_id = text_field(request.session_id, "session_id")
        bind(session_id=session_id)
        try:
            ticket = await launched(
                self.work,
                client_id,
                self.daemon.launch,
                client_id,
                session_id,
                id_fields(request.operands, "operands"),
                id_fields(request.results, "results"),
                convert.scalars_from_proto(request.runtime_scalars),
                watch=request.wait,
            )
        except Exception as error:
            self._count_failure(client_id, session_id, request.wait, error)
            raise
        enqueued = time.perf_counter() - started
        waited = request.wait or ticket.must_wait
        end = LaunchEnd(self.daemon, client_id, ticket, self.spin_seconds) if waited else None
        return _Pending(ticket, started, enqueued, end)

    async def finish(
        self, client_id: str, pending: _Pending, *, reap: bool = True
    ) -> pb.LaunchResponse:
        """Wait for the launch if it is to be waited for; its answer.

        With ``reap`` false the caller drops the finished launch from its
        session's log (``Daemon.reap``) once it has answered.
        """
        ticket, end = pending.ticket, pending.end
        if end is not None:
            try:
                await end.wait(reap=reap)
            except Exception as error:
                self._count_failure(client_id, ticket.session_id, True, error)
                raise
        waited = end is not None
        elapsed = time.perf_counter() - pending.started
        self.metrics.observe_launch(ticket.pipeline, elapsed, waited=waited)
        return pb.LaunchResponse(
            launch_id=ticket.launch_id,
            completed=waited,
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
            results = await self.work.run_for(
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
