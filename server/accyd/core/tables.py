"""The core's shared state: clients, devices, the ledger and the one lock, with their lookups.

``Daemon`` makes one ``Tables`` and gives it to each part it composes (holdings,
launching, replacing, status); nothing else reaches into it. Every lookup of a session
or a buffer goes through its owner (``Client``), so another client's id is ``NotFound``.

Only what two or more parts use is here. Each field is read or changed by several: the
lock, the ledger, the device health and the client table (attached and leaving clients)
by all of them; the backends by holdings, replacing and status; the engine's revoker by
launching (tickets) and holdings (revoked by frees); the partitions by holdings (a
session's stream), replacing (a new device split) and status. What one part alone keeps
is that part's own: launching's counts, the facade's catalogs and extensions.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from accyd.backends.base import Backend
from accyd.core.accounting import Ledger
from accyd.core.clients import Client, ClientTable
from accyd.core.device import DeviceHealth
from accyd.core.partitions import Partitions
from accyd.core.placement import home_of
from accyd.core.sessions import Session
from accyd.core.tickets import NO_TICKETS, Revoker
from accyd.errors import DeviceFault, NotFound

__all__ = ["Tables"]


@dataclass(eq=False)
class Tables:
    """Everything the core's parts share; changed under ``lock`` (never held across a device
    allocation or a wait)."""

    backends: dict[int, Backend]
    lock: threading.RLock
    ledger: Ledger
    state: DeviceHealth
    clients: ClientTable
    revoker: Revoker = NO_TICKETS
    """The ring engine's tickets, once one is attached (``Daemon.attach_engine``)."""
    partitions: Partitions = field(default_factory=Partitions)
    """Tenants' SM partitions and stream priorities (``core/partitions.py``)."""

    def backend(self, device: int) -> Backend:
        backend = self.backends.get(device)
        if backend is None:
            raise NotFound(
                f"no device {device}; this daemon serves {sorted(self.backends)}", field="device"
            )
        return backend

    def place(self, client_id: str, device: int | None) -> int:
        """The device a request goes to: the one it names, else the client's (``home_of``)."""
        if device is not None:
            return device
        with self.lock:
            return home_of(self.clients.get(client_id), self.backends, self.clients, self.state)

    def check_current(self, device: int, backend: Backend) -> None:
        """Under the lock: raise if ``device`` was lost or replaced since ``backend`` was taken."""
        self.state.check_alive(device)
        if self.backends.get(device) is not backend:
            fault = self.state.retired_fault(backend)
            raise self.state.noted(fault or DeviceFault("the device was replaced"), None, backend)

    def session(self, client_id: str, session_id: str) -> tuple[Client, Session]:
        client = self.clients.get(client_id)
        return client, client.session(session_id)

    def check_attached(self, client: Client) -> None:
        """Under the lock: refuse to hand ``client`` anything once it detached."""
        if self.clients.find(client.id) is not client:
            raise NotFound(f"client {client.id!r} detached", field="client_id")
