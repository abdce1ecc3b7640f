"""ModelStreamInfer streams: requests run at once, answers sent in order of readiness, bounded.

Each request of a stream holds one of the stream's ``STREAM_IN_FLIGHT`` turns from
the moment it is read until its answer is *written* (handed to gRPC, which holds
it no longer than the caller's flow-control window lets it), not merely queued:
so a caller that never reads stops being served once that many answers wait. Bytes
are bounded too: a request, once checked, runs only when the answers not yet
written leave room for its own within ``STREAM_UNSENT_BYTES`` (one answer alone
always runs), and no request is read while they fill it. (A request's own size is
not taken: protobuf would copy the whole message to say it; gRPC's largest message
bounds each of the ``STREAM_IN_FLIGHT``.) The stream's requests are counted as calls in flight while
they run or wait to be sent, the stream itself is not: an idle stream holds no
drain. ``Streams.end`` (the drain) ends the requests of every open stream: each
sends the answers it still runs, then ends with the error given. (A tokens
reload ends a stream whose token it removed as it ends any call:
``accyd.doors.grpc.in_flight``.)
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Awaitable, Callable

import structlog

from accyd.doors.grpc.calls import Call, CallTracker, log_failure
from accyd.doors.grpc.ending import until_ended
from accyd.doors.grpc.status import to_rpc_status
from accyd.doors.kserve.held import Hold
from accyd.doors.kserve.protocol import open_inference_pb2 as pb
from accyd.doors.kserve.turns import Turn
from accyd.errors import AccyError

__all__ = ["REQUEST_CALL", "STREAM_IN_FLIGHT", "STREAM_UNSENT_BYTES", "Reserve", "Streams"]

STREAM_IN_FLIGHT = 16
"""Requests of one stream running or waiting to be sent at once; the stream reads on as
their answers are written."""
STREAM_UNSENT_BYTES = 64 << 20
"""The bytes of a stream's answers made or being made, not yet written (one larger answer
alone aside); while they reach it, the stream reads no request."""
REQUEST_CALL = "ModelStreamInfer.request"
"""What one request of a stream counts as among the calls in flight."""

log = structlog.get_logger("accyd.doors.kserve")

_Reply = pb.ModelStreamInferResponse
Reserve = Callable[[int, Hold], Awaitable[None]]
"""Called by a request once checked, with its answer's size and the door's memory it holds
(released once the answer is written, or the stream ends): returns once there is room."""
Infer = Callable[[pb.ModelInferRequest, Reserve, Turn], Awaitable[pb.ModelInferResponse]]
"""Runs a request in the tenant turn given (and releases it)."""
Turns = Callable[[], Awaitable[Turn]]
"""One of the stream's tenant's turns, once free (``turns.py``)."""


class Streams:
    """The door's open ModelStreamInfer streams."""

    def __init__(self, calls: CallTracker) -> None:
        self._calls = calls
        self._open: set[asyncio.Event] = set()
        """Each open stream's requests' end."""
        self._ending: AccyError | None = None
        """Set by ``end``: a stream opened since ends at once."""

    def __len__(self) -> int:
        return len(self._open)

    def end(self, why: AccyError) -> int:
        """End the requests of every open stream, and of those opened from now on: each ends
        with ``why`` once its answers are sent. How many were open."""
        self._ending = why
        for ended in self._open:
            ended.set()
        return len(self._open)

    async def serve(
        self,
        requests: AsyncIterator[pb.ModelInferRequest],
        call: Call,
        infer: Infer,
        turns: Turns,
    ) -> AsyncIterator[_Reply]:
        """Run each request as it arrives; answer each (a failed one as its
        ``error_message``) as it is ready."""
        if self._ending is not None:
            raise self._ending
        ended = asyncio.Event()
        self._open.add(ended)
        try:
            async for reply in _Answers(self._calls, call, infer, turns).serve(
                until_ended(requests, ended)
            ):
                yield reply
        finally:
            self._open.discard(ended)
        if self._ending is not None and ended.is_set():
            raise self._ending


class _Answers:
    """One stream's requests running and its answers not yet written."""

    def __init__(self, calls: CallTracker, call: Call, infer: Infer, turns: Turns) -> None:
        self._calls = calls
        self._call = call
        self._infer = infer
        self._tenant_turn = turns
        self._held_turns: dict[asyncio.Task[None], Turn] = {}
        """Each running request's tenant turn (given back by the request, or as its task is
        cancelled before it began)."""
        self._turns = asyncio.Semaphore(STREAM_IN_FLIGHT)
        self._ready: collections.deque[tuple[_Reply, int, Hold | None]] = collections.deque()
        self._answers = 0
        """Bytes of the answers made or being made (reserved), not yet written."""
        self._waiting = 0
        """Requests waiting for room for their answers: none is read meanwhile (a large
        answer is not passed over for good by small ones read after it)."""
        self._moved = asyncio.Event()
        """An answer is ready, one was written, or the reading ended."""
        self._running: set[asyncio.Task[None]] = set()
        self._reading_done = False

    async def serve(self, requests: AsyncIterator[pb.ModelInferRequest]) -> AsyncIterator[_Reply]:
        reader = asyncio.ensure_future(self._read(requests))
        try:
            while True:
                while self._ready:
                    reply, size, hold = self._ready.popleft()
                    try:
                        yield reply  # resumed once it is written
                    finally:
                        self._sent(size)
                        if hold is not None:
                            hold.release()
                if self._reading_done and not self._running:
                    break
                self._moved.clear()
                if not self._ready:
                    await self._moved.wait()
            await reader  # its error, if reading failed
        finally:
            reader.cancel()
            for task in list(self._running):
                task.cancel()
            for _, _, hold in self._ready:  # not written: the stream ended under them
                self._calls.leave(REQUEST_CALL)
                if hold is not None:
                    hold.release()
            self._ready.clear()

    def _sent(self, size: int) -> None:
        self._answers -= size
        self._calls.leave(REQUEST_CALL)
        self._turns.release()
        self._moved.set()

    async def _until(self, ready: Callable[[], bool]) -> None:
        while not ready():
            self._moved.clear()
            await self._moved.wait()

    async def _read(self, requests: AsyncIterator[pb.ModelInferRequest]) -> None:
        try:
            async for one in requests:
                await self._turns.acquire()
                await self._until(lambda: self._answers < STREAM_UNSENT_BYTES and not self._waiting)
                try:
                    turn = await self._tenant_turn()  # no other request is read meanwhile
                except BaseException:
                    self._turns.release()
                    raise
                self._calls.enter(REQUEST_CALL)
                task = asyncio.ensure_future(self._answer(one, turn))
                self._running.add(task)
                self._held_turns[task] = turn
                task.add_done_callback(self._finished)
        finally:
            self._reading_done = True
            self._moved.set()

    def _finished(self, task: asyncio.Task[None]) -> None:
        """A request's task is over: its answer is ready, or it was cancelled (it may not
        have begun: its own code cannot count it out)."""
        self._running.discard(task)
        self._held_turns.pop(task).release()  # (idempotent: the request released it)
        if task.cancelled():
            self._calls.leave(REQUEST_CALL)
        self._moved.set()

    async def _answer(self, one: pb.ModelInferRequest, turn: Turn) -> None:
        reserved = 0
        held: Hold | None = None

        async def reserve(answer: int, hold: Hold) -> None:
            """The request is checked: its answer will be ``answer`` bytes. Wait until the
            answers not yet written leave room for it (one alone always fits)."""
            nonlocal reserved, held
            self._waiting += 1
            try:
                await self._until(
                    lambda: not self._answers or self._answers + answer <= STREAM_UNSENT_BYTES
                )
            finally:
                self._waiting -= 1
                self._moved.set()
            self._answers += answer
            reserved = answer
            held = hold

        try:
            reply = _Reply(infer_response=await self._infer(one, reserve, turn))
        except Exception as error:
            held = None  # released by the request as it failed
            log_failure("stream request", error, request_id=self._call.request_id)
            status = to_rpc_status(error, self._call.request_id)
            reply = _Reply(error_message=status.message)
            reply.infer_response.id = one.id
        self._ready.append((reply, reserved, held))
        self._moved.set()
