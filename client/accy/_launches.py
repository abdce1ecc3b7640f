"""One LaunchStream call: launches go out as messages, each answer comes back to its caller."""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

import grpc

from accy._rpc import Stub
from accy.errors import AccyError, Cancelled, DeadlineExceeded, Unavailable, from_rpc_status
from accy.launch.v1 import launch_pb2 as pb

if TYPE_CHECKING:
    from grpc import _CallIterator

__all__ = ["LaunchStream"]

_END = None


class LaunchStream:
    """An open LaunchStream on one link; ``launch()`` is safe from any thread.

    Launching on a stream skips a unary call's per-call setup on both sides,
    about half its cost. The Client opens one per link (it carries the link's
    client id) the first time a session launches, and closes it with the link.
    Requests are tagged; a reader thread gives each answer to the caller that
    waits for it, so a long waited launch does not hold up other threads'
    launches. A caller that stops waiting (its timeout) leaves its launch on the
    daemon, as a unary call's deadline does.
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
        self._tags = itertools.count(1)
        self._waiting: dict[int, Future[pb.LaunchResponse]] = {}
        self._failure: AccyError | None = None
        self._outbox: queue.SimpleQueue[pb.LaunchRequest | None] = queue.SimpleQueue()
        self._call: _CallIterator[pb.LaunchStreamResponse] = stub.LaunchStream(
            self._requests(), metadata=tuple(metadata)
        )
        self._reader = threading.Thread(target=self._read, name="accy-launches", daemon=True)
        self._reader.start()

    @property
    def broken(self) -> bool:
        """Whether the stream ended: launches need a new one."""
        return self._failure is not None

    def launch(self, request: pb.LaunchRequest, timeout: float | None) -> pb.LaunchResponse:
        """Send ``request`` and block for its answer; a refusal raises its typed error."""
        answer: Future[pb.LaunchResponse] = Future()
        with self._lock:
            if self._failure is not None:
                raise self._failure.with_traceback(None)
            tag = next(self._tags)
            request.tag = tag
            self._waiting[tag] = answer
            self._outbox.put(request)
        try:
            return answer.result(timeout)
        except TimeoutError:
            with self._lock:
                self._waiting.pop(tag, None)
            raise DeadlineExceeded(
                f"no answer to the launch on session {request.session_id} within {timeout} s; "
                "it may still run (wait on the session to be sure)"
            ) from None

    def close(self, why: AccyError | None = None) -> None:
        """End the stream; launches still waiting raise ``why`` (else ``Cancelled``); idempotent."""
        self._fail(why or Cancelled("the client closed its launch stream"))
        self._outbox.put(_END)
        self._call.cancel()

    def _requests(self) -> Iterator[pb.LaunchRequest]:
        while (request := self._outbox.get()) is not _END:
            yield request

    def _read(self) -> None:
        try:
            for answer in self._call:
                with self._lock:
                    waiter = self._waiting.pop(answer.tag, None)
                if waiter is None:  # its caller gave up waiting
                    continue
                if answer.WhichOneof("outcome") == "launch":
                    waiter.set_result(answer.launch)
                else:
                    waiter.set_exception(self._hint(from_rpc_status(answer.error)))
        except grpc.RpcError as error:
            self._fail(self._translate(error))
        else:
            self._fail(Unavailable("the daemon ended the launch stream"))

    def _fail(self, error: AccyError) -> None:
        """Fail every launch waiting with ``error``, and every later one (the first error wins)."""
        with self._lock:
            if self._failure is None:
                self._failure = error
            waiting = list(self._waiting.values())
            self._waiting.clear()
        for waiter in waiting:
            if not waiter.done():
                waiter.set_exception(self._failure)
