"""Device state: the fault latch (a lost device stays lost) and the drain (no new work)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import structlog

from accyd.errors import DeviceFault, Unavailable

__all__ = ["DeviceState"]

log = structlog.get_logger("accyd.core")


class DeviceState:
    """Whether the core still takes work: not once draining, nor after a device fault.

    A sticky device error poisons the process (DESIGN.md, "Fault model"): the
    first ``DeviceFault`` is latched, reported once to ``on_fault``, and every
    later call learns which session's work lost the device.
    """

    def __init__(
        self, lock: threading.RLock, on_fault: Callable[[DeviceFault], None] | None = None
    ) -> None:
        self._lock = lock
        self._on_fault = on_fault
        self.draining = False
        self.fault: DeviceFault | None = None

    @property
    def serving(self) -> bool:
        return not self.draining and self.fault is None

    def begin_drain(self) -> None:
        """Refuse new work from now on; idempotent (logged once)."""
        with self._lock:
            first, self.draining = not self.draining, True
        if first:
            log.info("draining")

    def check_alive(self) -> None:
        fault = self.fault
        if fault is not None:
            raise DeviceFault(
                f"the device was lost ({fault.message}); reattach once the daemon restarts",
                session=fault.session,
            )

    def check_serving(self) -> None:
        self.check_alive()
        if self.draining:
            raise Unavailable("the daemon is shutting down; retry against its successor")

    def noted(self, fault: DeviceFault, session_id: str | None = None) -> DeviceFault:
        """Latch ``fault`` (the first one wins); the error to raise in its place."""
        noted = DeviceFault(fault.message, session=fault.session or session_id)
        with self._lock:
            first, self.fault = self.fault is None, self.fault or noted
            origin = self.fault
        if first:
            log.error("device fault", session_id=noted.session, error=noted.message)
            if self._on_fault is not None:
                self._on_fault(noted)
        # Every caller learns which session's work lost the device, the first one too.
        return DeviceFault(origin.message, session=origin.session)

    @contextlib.contextmanager
    def guard(self, session_id: str | None = None) -> Iterator[None]:
        """Latch a device fault raised inside (the process must restart) as it propagates."""
        try:
            yield
        except DeviceFault as fault:
            raise self.noted(fault, session_id) from fault
