"""``FakeTransport``: a link's data plane kept in this process, for tests (``accy.testing``)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from accy._scalars import check_scalars
from accy._seam import CopyRequest, LaunchRequest, ReadRequest, Ticket, WaitRequest, WriteRequest
from accy.errors import AccyError

__all__ = ["FakeTransport"]

Request = LaunchRequest | WaitRequest | WriteRequest | ReadRequest | CopyRequest


class FakeTransport:
    """A ``Transport`` that sends nothing: give it to ``Client(transport=FakeTransport())``.

    The client still attaches to its daemon and makes its control calls there (load,
    allocate, release, free, status), but every launch, wait, write, read and copy of
    its sessions and buffers comes here, as a request value (``accy._seam``), in
    ``requests``. A launch's scalars are checked as on every real path, then it is
    answered at once (``Launch.id`` ``fake-<n>``, completed if it was waited for);
    written bytes are kept per buffer id and read back (zeros where nothing was
    written); ``fail_next(error)`` makes the next operation raise ``error`` instead.
    One fake serves every attachment of its client; it is safe from any thread.
    """

    path = "fake"

    def __init__(self) -> None:
        self.requests: list[Request] = []
        """Every request handed to this transport, in order."""
        self.forgotten: list[str] = []
        """Session and buffer ids the client let go of (released, freed, collected)."""
        self.closed = False
        self._data: dict[str, bytearray] = {}
        self._failures: list[AccyError] = []
        self._lock = threading.Lock()

    def fail_next(self, error: AccyError) -> None:
        """Raise ``error`` from the next operation (after this, the one after)."""
        with self._lock:
            self._failures.append(error)

    def launches(self) -> list[LaunchRequest]:
        """The launches handed here, in order."""
        return [r for r in self.requests if isinstance(r, LaunchRequest)]

    def bytes_of(self, buffer_id: str) -> bytes:
        """What was written to ``buffer_id`` here."""
        with self._lock:
            return bytes(self._data.get(buffer_id, b""))

    # -- the Transport ---------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> Ticket:
        self._take(request)
        check_scalars(request.session.info, request.scalars)
        with self._lock:
            number = sum(isinstance(r, LaunchRequest) for r in self.requests)
        return Ticket(self, request.session.id, request.wait, launch_id=f"fake-{number}")

    def wait(self, request: WaitRequest) -> None:
        self._take(request)

    def forget(self, object_id: str) -> None:
        with self._lock:
            self.forgotten.append(object_id)

    def write(self, request: WriteRequest) -> int:
        self._take(request)
        data, at = bytes(request.data), request.offset
        with self._lock:
            held = self._data.setdefault(request.buffer_id, bytearray())
            if len(held) < at + len(data):
                held.extend(bytes(at + len(data) - len(held)))
            held[at : at + len(data)] = data
        if request.progress is not None:
            request.progress(len(data), len(data))
        return len(data)

    def read(self, request: ReadRequest) -> np.ndarray[Any, Any]:
        self._take(request)
        at, size = request.offset, request.size
        with self._lock:
            held = bytes(self._data.get(request.buffer_id, b"")[at : at + size])
        got = np.zeros(size, np.uint8)
        got[: len(held)] = np.frombuffer(held, np.uint8)
        if request.progress is not None:
            request.progress(size, size)
        if request.into is None:
            return got
        flat = request.into.reshape(-1).view(np.uint8)
        flat[:] = got
        return flat

    def copy(self, request: CopyRequest) -> int:
        self._take(request)
        return request.size

    def close(self, drain: float = 0.0) -> None:
        self.closed = True

    def abandon(self) -> None:
        """Nothing is shared with a parent process."""

    def _take(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)
            failure = self._failures.pop(0) if self._failures else None
        if failure is not None:
            raise failure
