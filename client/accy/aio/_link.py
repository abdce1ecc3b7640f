"""The asyncio client's attachment: its ``grpc.aio`` channel, Attach stream, pings and calls.

Errors are translated here, once, by the blocking client's own function
(``accy._failures.translate``): a failed call raises the same typed ``AccyError``
with the same message. The Attach stream is read by a task for as long as the
client lives; when it ends (the daemon restarted or detached the client) every
later call raises why: this client does not attach again by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol, TypeVar

import grpc
import grpc.aio
from google.protobuf.message import Message

from accy._connection import UNSET
from accy._failures import translate
from accy._link import device_lost, names_client
from accy._models import Attachment
from accy._rpc import method_path, open_aio_channel
from accy.errors import (
    AccyError,
    ClientClosed,
    DaemonUnreachable,
    DeadlineExceeded,
    Unavailable,
)
from accy.protocol import CLIENT_ID_METADATA
from accy.protocol.launch.v1 import launch_pb2 as pb

__all__ = ["AioLink", "AioStub", "LinkRing"]

LOSS_GRACE = 1.0
"""How long a call that found no daemon waits to learn whether the daemon went away (the
Attach stream ends) rather than being out of reach for a moment."""

_Req = TypeVar("_Req", bound=Message)


class LinkRing(Protocol):
    """What a link asks of its ring (``accy.aio._ring.AioRing``, which holds the link): the
    link's calls wait for it to settle, and its objects' ends are forgotten there."""

    async def wait(self, ticket: Any, session_id: str | None, timeout: Any) -> None: ...

    async def settle(self) -> None: ...

    def forget(self, object_id: str) -> None: ...

    def close(self) -> None: ...


_Resp = TypeVar("_Resp", bound=Message)
_T = TypeVar("_T")


class AioStub:
    """One typed ``grpc.aio`` multi-callable per launch-service method the asyncio client calls."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        def uu(
            name: str, req: type[_Req], resp: type[_Resp]
        ) -> grpc.aio.UnaryUnaryMultiCallable[_Req, _Resp]:
            return channel.unary_unary(method_path(name), req.SerializeToString, resp.FromString)

        self.Attach = channel.unary_stream(
            method_path("Attach"), pb.AttachRequest.SerializeToString, pb.AttachEvent.FromString
        )
        self.Ping = uu("Ping", pb.PingRequest, pb.PingResponse)
        self.ListPipelines = uu("ListPipelines", pb.ListPipelinesRequest, pb.ListPipelinesResponse)
        self.LoadPipeline = uu("LoadPipeline", pb.LoadPipelineRequest, pb.LoadPipelineResponse)
        self.AllocateIntermediates = uu(
            "AllocateIntermediates",
            pb.AllocateIntermediatesRequest,
            pb.AllocateIntermediatesResponse,
        )
        self.Launch = uu("Launch", pb.LaunchRequest, pb.LaunchResponse)
        self.WaitLaunch = uu("WaitLaunch", pb.WaitLaunchRequest, pb.WaitLaunchResponse)
        self.Release = uu("Release", pb.ReleaseRequest, pb.ReleaseResponse)
        self.AllocateBuffer = uu(
            "AllocateBuffer", pb.AllocateBufferRequest, pb.AllocateBufferResponse
        )
        self.WriteBuffer = channel.stream_unary(
            method_path("WriteBuffer"),
            pb.WriteBufferChunk.SerializeToString,
            pb.WriteBufferResponse.FromString,
        )
        self.ReadBuffer = channel.unary_stream(
            method_path("ReadBuffer"),
            pb.ReadBufferRequest.SerializeToString,
            pb.ReadBufferChunk.FromString,
        )
        self.FreeBuffer = uu("FreeBuffer", pb.FreeBufferRequest, pb.FreeBufferResponse)
        self.Run = uu("Run", pb.RunRequest, pb.RunResponse)
        self.GetStatus = uu("GetStatus", pb.GetStatusRequest, pb.GetStatusResponse)
        self.OpenRing = uu("OpenRing", pb.OpenRingRequest, pb.OpenRingResponse)


class AioLink:
    """One attachment of an asyncio client: calls go out with its client id and come back typed.

    Made and closed on one event loop (``grpc.aio`` channels belong to the loop
    they were made on).
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
        self.secure = credentials is not None
        self._has_token = has_token
        self._auth = auth
        self.channel = open_aio_channel(target, credentials, server_name=server_name)
        self.stub = AioStub(self.channel)
        self.metadata = auth
        """Sent with every call: the credentials, then (once attached) the client's id."""
        self.attachment: Attachment | None = None
        self.lost: AccyError | None = None
        """Why the attachment ended, once it did: every call then raises it."""
        self.closed = False
        self.ring: LinkRing | None = None
        """The ring launches go through (``accy.aio._ring``), once the first launch opened it."""
        self.ring_tried = False
        self.ring_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._loop = asyncio.get_running_loop()
        self._later: set[asyncio.Task[None]] = set()
        self._ended = asyncio.Event()
        """Set once the Attach stream ended."""
        self._attach: grpc.aio.UnaryStreamCall[Any, pb.AttachEvent] | None = None

    # -- errors ---------------------------------------------------------------------------

    def translate(self, error: grpc.RpcError) -> AccyError:
        """The typed error of a failed call: the blocking client's translation, unchanged."""
        return translate(error, target=self.target, secure=self.secure, has_token=self._has_token)

    def judged(self, failure: AccyError, link: object = None) -> AccyError:
        """``failure``, after ending the attachment if it shows the daemon forgot this client
        (``link``: this one, as the ring's launches name it)."""
        if (device_lost(failure) or names_client(failure)) and self.lost is None:
            self.lost = failure
        return failure

    def closed_error(self) -> ClientClosed:
        return ClientClosed(f"the client of {self.target} is closed; make a new AsyncClient")

    def lost_error(self, what: str) -> Unavailable:
        """Why nothing more goes out once the attachment ended (``what``: the work it took)."""
        lost = self.lost
        assert lost is not None
        return Unavailable(
            f"{what}: this client's attachment to {self.target} ended ({lost.message}); "
            "make a new AsyncClient",
            reason=lost.reason or "DETACHED",
            metadata=dict(lost.metadata),
        )

    async def failed(self, error: grpc.RpcError) -> AccyError:
        """The error a failed call raises: its own, unless it found no daemon because the
        daemon went away (the Attach stream ends within ``LOSS_GRACE``): then why the
        attachment ended, which says what to do."""
        failure = self.judged(self.translate(error))
        if isinstance(failure, DaemonUnreachable) and self.lost is None and not self.closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ended.wait(), LOSS_GRACE)
        if self.lost is not None and self.lost is not failure and not self.closed:
            return self.lost_error(f"the call failed ({failure.message})")
        return failure

    def check_open(self) -> None:
        """Raise why no call may go out: the client closed, or its attachment ended."""
        if self.closed:
            raise self.closed_error()
        if self.lost is not None:
            raise self.lost_error("no call can go out")

    def timeout_of(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is UNSET else timeout

    # -- attaching ------------------------------------------------------------------------

    async def attach(self, name: str, liveness: int, timeout: float) -> Attachment:
        """Open the Attach stream and wait (``timeout`` seconds at most) for the daemon to name
        the client; then keep the stream read, and ping every quarter of ``liveness``."""
        request = pb.AttachRequest(client_name=name, liveness_seconds=liveness)
        call = self.stub.Attach(request, metadata=self._auth)
        self._attach = call
        try:
            event = await asyncio.wait_for(call.read(), timeout)
        except TimeoutError:
            call.cancel()
            raise DeadlineExceeded(f"the daemon did not answer Attach within {timeout} s") from None
        except grpc.RpcError as error:
            raise self.translate(error) from None
        if event is grpc.aio.EOF:
            raise Unavailable("the Attach stream ended before naming the client")
        assert isinstance(event, pb.AttachEvent)
        if event.WhichOneof("event") != "attached":
            call.cancel()
            raise Unavailable("the Attach stream did not begin by naming the client")
        self.attachment = Attachment.from_proto(event.attached)
        self.metadata = (*self._auth, (CLIENT_ID_METADATA, self.attachment.client_id))
        self._tasks.append(asyncio.create_task(self._pump(call), name="accy-aio-attach"))
        if liveness:
            self._tasks.append(asyncio.create_task(self._ping(liveness / 4), name="accy-aio-ping"))
        return self.attachment

    async def _pump(self, call: grpc.aio.UnaryStreamCall[Any, pb.AttachEvent]) -> None:
        """Read the Attach stream's heartbeats until it ends; then note why."""
        why: AccyError = Unavailable(
            "the daemon ended this client's Attach stream", reason="DETACHED"
        )
        try:
            while await call.read() is not grpc.aio.EOF:  # read(), as attach() began: not both ways
                pass
        except grpc.RpcError as error:
            why = self.translate(error)
        finally:
            if not self.closed and self.lost is None:
                self.lost = why
            self._ended.set()

    async def _ping(self, period: float) -> None:
        """Tell the daemon this client lives, four times per liveness period."""
        request = pb.PingRequest()
        while self.lost is None:
            await asyncio.sleep(period)
            with contextlib.suppress(grpc.RpcError):
                await self.stub.Ping(request, metadata=self.metadata, timeout=period)

    # -- calls ----------------------------------------------------------------------------

    async def call(
        self,
        method: grpc.aio.UnaryUnaryMultiCallable[Any, _T],
        request: Any,
        timeout: float | None = UNSET,
    ) -> _T:
        """One unary call; a failure raises its typed error ``from`` the gRPC one."""
        self.check_open()
        if self.ring is not None:
            await self.ring.settle()
        try:
            return await method(request, metadata=self.metadata, timeout=self.timeout_of(timeout))
        except grpc.RpcError as error:
            raise await self.failed(error) from error

    async def stream_in(
        self,
        method: grpc.aio.StreamUnaryMultiCallable[Any, _T],
        requests: Iterator[Any],
        timeout: float | None,
    ) -> _T:
        """A client-streaming call (a buffer's writes)."""
        self.check_open()
        if self.ring is not None:
            await self.ring.settle()
        try:
            return await method(requests, metadata=self.metadata, timeout=timeout)
        except grpc.RpcError as error:
            raise await self.failed(error) from error

    async def stream_out(
        self,
        method: grpc.aio.UnaryStreamMultiCallable[Any, _T],
        request: Any,
        timeout: float | None,
        take: Callable[[_T], None],
    ) -> None:
        """A server-streaming call (a buffer's reads): each answer to ``take``; cancelled if left
        early."""
        self.check_open()
        if self.ring is not None:
            await self.ring.settle()
        call = method(request, metadata=self.metadata, timeout=timeout)
        try:
            async for answer in call:
                take(answer)
        except grpc.RpcError as error:
            raise await self.failed(error) from error
        finally:
            call.cancel()

    def later(self, work: Callable[[], Awaitable[object]]) -> None:
        """Run ``work()`` soon on this link's loop, ignoring its errors: for a cleanup asked
        from a finalizer, which may run on any thread and must not block or raise."""
        loop = self._loop

        def start() -> None:
            if self.closed or self.lost is not None:
                return  # the daemon frees it all with the client
            task = loop.create_task(_quietly(work()))
            self._later.add(task)
            task.add_done_callback(self._later.discard)

        with contextlib.suppress(RuntimeError):  # the loop is closed: so is the client
            loop.call_soon_threadsafe(start)

    async def close(self) -> None:
        """End the Attach stream (the daemon frees what the client made) and the channel."""
        if self.closed:
            return
        self.closed = True
        if self.ring is not None:
            self.ring.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._attach is not None:
            self._attach.cancel()
        await self.channel.close()


async def _quietly(work: Awaitable[object]) -> None:
    with contextlib.suppress(AccyError):
        await work
