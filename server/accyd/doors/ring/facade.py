"""What a ring needs of the core facade (``accyd.core.daemon.Daemon`` fits), as a protocol."""

from __future__ import annotations

from typing import Protocol

from accyd.backends.base import Backend
from accyd.catalog.model import ScalarSpec
from accyd.core.launching import LaunchContract
from accyd.errors import AccyError, DeviceFault

__all__ = ["RingCore", "RingObserver"]


class RingCore(LaunchContract, Protocol):
    """The operations every front door calls, and the few a ring's records need."""

    @property
    def backends(self) -> dict[int, Backend]: ...

    def reap(self, client_id: str, session_id: str) -> bool: ...

    def session_scalars(self, client_id: str, session_id: str) -> tuple[ScalarSpec, ...]: ...

    def check_buffer(self, client_id: str, buffer_id: str) -> None: ...

    def touch(self, client_id: str) -> None: ...

    def note_fault(
        self, fault: DeviceFault, session_id: str | None, device: int
    ) -> DeviceFault: ...


class RingObserver(Protocol):
    """Who counts a ring's launches (the service's metrics); called by whoever takes its
    records, so it must be quick and must not raise."""

    def launched(self, client_id: str, session_id: str, count: int) -> None:
        """``count`` launch records of the session were checked and enqueued."""

    def refused(self, client_id: str, session_id: str | None, error: AccyError) -> None:
        """A launch record was refused (its session, if the record named a bound one)."""
