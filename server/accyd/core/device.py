"""Device state: the fault latch (a lost device stays lost until replaced) and the drain."""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping

import structlog

from accyd.backends.base import Backend
from accyd.errors import DeviceFault, Unavailable

__all__ = ["DeviceHealth", "FaultHandler"]

log = structlog.get_logger("accyd.core")

FaultHandler = Callable[[DeviceFault], None]
"""Told once of each fault latched: the whole process's, or one isolated device's."""


class DeviceHealth:
    """Whether the core still takes work: not once draining, nor on a faulted device.

    A sticky device error poisons the process that drives the device (DESIGN.md,
    "Fault model"). Two cases:

    - Not ``isolated`` (the backends run in this process): the first
      ``DeviceFault`` is latched for the whole daemon, reported once to
      ``on_fault``, and every later call learns which session's work lost the
      device; the process restarts.
    - ``isolated`` (each device runs in a worker process of its own): a fault is
      latched for its device only (``lost``), reported once to ``on_fault``, and
      calls on that device fail until ``replaced``; work on the other devices
      goes on. A backend that was replaced is ``retired``: late errors from it
      name its fault and latch nothing.

    ``backends`` is the daemon's own table (device index -> backend), read to
    tell which device a failing backend drives.
    """

    def __init__(
        self,
        lock: threading.RLock,
        backends: Mapping[int, Backend],
        on_fault: FaultHandler | None = None,
        *,
        isolated: bool = False,
    ) -> None:
        self._lock = lock
        self._backends = backends
        self._on_fault = on_fault
        self.isolated = isolated
        self.draining = False
        self.fault: DeviceFault | None = None
        """The whole daemon's fault (never set when isolated)."""
        self.lost: dict[int, DeviceFault] = {}
        """Isolated devices faulted and not yet replaced."""
        self.replacements: dict[int, int] = {}
        """Faults each isolated device was replaced after."""
        self._retired: weakref.WeakKeyDictionary[Backend, DeviceFault] = weakref.WeakKeyDictionary()
        """Each replaced backend still held somewhere -> the fault it was replaced after."""
        self.watchers: list[Callable[[DeviceHealth], None]] = []
        """Told after every change (drain, fault, a device lost or replaced), maybe under the
        lock: an engine that launches by itself stops or goes on with the core. Quick."""

    def _changed(self) -> None:
        for watcher in self.watchers:
            watcher(self)

    @property
    def serving(self) -> bool:
        return not self.draining and self.fault is None

    def begin_drain(self) -> None:
        """Refuse new work from now on; idempotent (logged once)."""
        with self._lock:
            first, self.draining = not self.draining, True
        if first:
            self._changed()
            log.info("draining")

    def check_alive(self, device: int | None = None) -> None:
        """Raise the fault that stops work: the daemon's, or ``device``'s."""
        fault = self.fault
        if fault is not None:
            raise DeviceFault(
                f"the device was lost ({fault.message}); reattach once the daemon restarts",
                session=fault.session,
                device=fault.device,
            )
        if device is not None and (lost := self.lost.get(device)) is not None:
            raise _device_lost(lost, "it is being replaced: load again in a moment")

    def check_serving(self, device: int | None = None) -> None:
        self.check_alive(device)
        if self.draining:
            raise Unavailable("the daemon is shutting down; retry against its successor")

    def retired_fault(self, backend: Backend) -> DeviceFault | None:
        """The fault ``backend`` was replaced after, if it was."""
        return self._retired.get(backend)

    def noted(
        self, fault: DeviceFault, session_id: str | None = None, backend: Backend | None = None
    ) -> DeviceFault:
        """Latch ``fault`` (the first one wins); the error to raise in its place.

        ``backend`` is the one whose work failed: when isolated, only its device
        is latched; one already replaced latches nothing.
        """
        noted = DeviceFault(fault.message, session=fault.session or session_id)
        with self._lock:
            if self.isolated and backend is not None:
                retired = self._retired.get(backend)
                if retired is not None:
                    return _device_lost(retired, "it was replaced: load again")
                device = next((d for d, b in self._backends.items() if b is backend), None)
                if device is not None:
                    return self._note_device(device, noted)
            first, self.fault = self.fault is None, self.fault or noted
            origin = self.fault
        if first:
            self._changed()
            log.error("device fault", session_id=noted.session, error=noted.message)
            if self._on_fault is not None:
                self._on_fault(noted)
        # Every caller learns which session's work lost the device, the first one too.
        return DeviceFault(origin.message, session=origin.session)

    def device_lost(self, device: int, fault: DeviceFault) -> DeviceFault:
        """Latch a fault on isolated ``device`` found outside any call (its worker died)."""
        with self._lock:
            return self._note_device(device, DeviceFault(fault.message, session=fault.session))

    def _note_device(self, device: int, noted: DeviceFault) -> DeviceFault:
        """Under the lock: latch ``noted`` for ``device``; tell ``on_fault`` of the first."""
        first = device not in self.lost
        if first:
            self.lost[device] = DeviceFault(
                noted.message, session=noted.session, device=device, isolated=True
            )
        origin = self.lost[device]
        if first:
            self._changed()
            log.error(
                "device fault", device=device, session_id=origin.session, error=origin.message
            )
            if self._on_fault is not None:
                # Its own thread: the handler replaces the device, which takes the lock.
                threading.Thread(
                    target=self._on_fault, args=(origin,), name=f"accyd-replace-{device}"
                ).start()
        return _device_lost(origin, "it is being replaced: load again in a moment")

    def replaced(self, device: int, old: Backend) -> DeviceFault | None:
        """Under the lock: ``device`` serves again; ``old`` is retired. Its fault, if any."""
        fault = self.lost.pop(device, None)
        self._retired[old] = fault or DeviceFault("the device was replaced", device=device)
        self.replacements[device] = self.replacements.get(device, 0) + 1
        self._changed()
        return fault

    @contextlib.contextmanager
    def guard(
        self, session_id: str | None = None, backend: Backend | None = None
    ) -> Iterator[None]:
        """Latch a device fault raised inside (``backend``'s, when known) as it propagates."""
        try:
            yield
        except DeviceFault as fault:
            raise self.noted(fault, session_id, backend) from fault


def _device_lost(origin: DeviceFault, then: str) -> DeviceFault:
    """The error for a call that meets isolated device ``origin.device`` lost."""
    return DeviceFault(
        f"device {origin.device} was lost ({origin.message}); {then}",
        session=origin.session,
        device=origin.device,
        isolated=True,
    )
