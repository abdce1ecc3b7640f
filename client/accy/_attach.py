"""The Attach stream, kept open by a background thread for as long as the client lives."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import grpc

from accy._models import Attachment
from accy._rpc import Stub
from accy.errors import AccyError, DeadlineExceeded, Unavailable
from accy.launch.v1 import launch_pb2

__all__ = ["AttachStream"]


class AttachStream:
    """Reads the daemon's Attach events on a daemon thread; closing it detaches the client.

    The first event names the client; later ones are heartbeats, counted in
    ``heartbeats``. If the stream ends while the client still wants it,
    ``error`` says why (the daemon restarted, drained, or went away).
    """

    def __init__(
        self,
        stub: Stub,
        client_name: str,
        metadata: Sequence[tuple[str, str]],
        translate: Callable[[grpc.RpcError], AccyError],
    ) -> None:
        self._translate = translate
        self._attached: Attachment | None = None
        self._ready = threading.Event()
        self._closing = False
        self.error: AccyError | None = None
        self.heartbeats = 0
        self._call = stub.Attach(
            launch_pb2.AttachRequest(client_name=client_name), metadata=tuple(metadata)
        )
        self._thread = threading.Thread(target=self._pump, name="accy-attach", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        try:
            for event in self._call:
                if event.WhichOneof("event") == "attached":
                    self._attached = Attachment.from_proto(event.attached)
                    self._ready.set()
                else:
                    self.heartbeats += 1
            if not self._closing:
                self.error = Unavailable("the daemon ended this client's Attach stream")
        except grpc.RpcError as error:
            if not self._closing:
                self.error = self._translate(error)
        finally:
            self._ready.set()

    @property
    def alive(self) -> bool:
        """Whether the stream is still open."""
        return self._thread.is_alive()

    def wait_attached(self, timeout: float | None) -> Attachment:
        """Block until the daemon named this client; raise what went wrong otherwise."""
        if not self._ready.wait(timeout):
            self.close()
            raise DeadlineExceeded(f"the daemon did not answer Attach within {timeout} s")
        if self._attached is None:
            self.close()
            raise self.error or Unavailable("the Attach stream ended before naming the client")
        return self._attached

    def close(self, timeout: float = 5.0) -> None:
        """Detach: cancel the stream and wait briefly for the reader thread."""
        self._closing = True
        self._call.cancel()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
