"""One Attach stream: open it, wait for the daemon to name the client, read it until it ends."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import grpc

from accy._models import Attachment
from accy._rpc import Stub
from accy.errors import AccyError, DeadlineExceeded, Unavailable
from accy.protocol.launch.v1 import launch_pb2

if TYPE_CHECKING:
    from grpc import _CallIterator

__all__ = ["AttachStream"]


class AttachStream:
    """An open Attach stream and the client it named; ``pump()`` reads its heartbeats.

    The daemon frees everything the client made once this stream ends, so the
    client keeps it open for as long as it lives (a background thread pumps it).
    """

    def __init__(
        self,
        call: _CallIterator[launch_pb2.AttachEvent],
        attachment: Attachment,
        translate: Callable[[grpc.RpcError], AccyError],
    ) -> None:
        self._call = call
        self._translate = translate
        self.attachment = attachment
        self.heartbeats = 0

    @classmethod
    def open(
        cls,
        stub: Stub,
        client_name: str,
        metadata: Sequence[tuple[str, str]],
        translate: Callable[[grpc.RpcError], AccyError],
        timeout: float | None,
        *,
        wait_for_ready: bool = False,
        liveness_seconds: int = 0,
    ) -> AttachStream:
        """Attach and block until the daemon names the client, for at most ``timeout`` seconds.

        With ``wait_for_ready`` the call waits for the channel to connect
        instead of failing at once when no daemon answers (used to reattach).
        With ``liveness_seconds`` the daemon detaches the client once it has
        been silent that long, so the caller must call (or Ping) more often.
        """
        call = stub.Attach(
            launch_pb2.AttachRequest(client_name=client_name, liveness_seconds=liveness_seconds),
            metadata=tuple(metadata),
            wait_for_ready=wait_for_ready,
        )
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            call.cancel()

        timer = threading.Timer(timeout, expire) if timeout is not None else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            event = next(call)
        except StopIteration:
            raise Unavailable("the Attach stream ended before naming the client") from None
        except grpc.RpcError as error:
            if expired.is_set():
                raise DeadlineExceeded(
                    f"the daemon did not answer Attach within {timeout} s"
                ) from None
            raise translate(error) from None
        finally:
            if timer is not None:
                timer.cancel()
        if event.WhichOneof("event") != "attached":
            call.cancel()
            raise Unavailable("the Attach stream did not begin by naming the client")
        return cls(call, Attachment.from_proto(event.attached), translate)

    def pump(self) -> AccyError:
        """Read heartbeats until the stream ends; returns why it ended."""
        try:
            for event in self._call:
                if event.WhichOneof("event") == "heartbeat":
                    self.heartbeats += 1
        except grpc.RpcError as error:
            return self._translate(error)
        return Unavailable("the daemon ended this client's Attach stream", reason="DETACHED")

    def cancel(self) -> None:
        """End the stream from this side (the daemon then detaches the client)."""
        self._call.cancel()
