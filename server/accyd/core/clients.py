"""Attached clients and the table that routes every call to its client's state.

Every lookup of a session or buffer goes through its owner, so another
client's id is answered exactly as an unknown one: ``NotFound``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from accyd.backends.base import Stream
from accyd.core.buffers import BufferRecord
from accyd.core.sessions import Session, SessionKey
from accyd.core.tenants import Tenant
from accyd.errors import DeviceFault, InvalidRequest, NotFound

__all__ = ["Client", "ClientTable"]


@dataclass(eq=False)
class Client:
    """One attached client of one tenant, and everything it owns."""

    id: str
    name: str
    tenant: Tenant
    attached_at: float = field(default_factory=time.time)
    sessions: dict[str, Session] = field(default_factory=dict)
    session_ids: dict[SessionKey, str] = field(default_factory=dict)
    buffers: dict[str, BufferRecord] = field(default_factory=dict)
    transfer_streams: dict[int, Stream] = field(default_factory=dict)
    launches_in_flight: int = 0
    """Launches enqueued and not yet found finished, over all its sessions (a limit applies)."""
    last_seen: float = field(default_factory=time.monotonic)
    """When the client last made a call (monotonic seconds): how liveness is judged."""
    home_device: int | None = None
    """Where its sessions and buffers go when a request names no device (placed once)."""
    counter: int = -1
    """The engine's in-flight counter of this client's launches (-1: none yet)."""
    lost: dict[str, DeviceFault] = field(default_factory=dict)
    """Sessions and buffers that went with an isolated device's fault: calls naming them
    get that fault, not ``NotFound``."""

    def silent_for(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.last_seen

    def session(self, session_id: str) -> Session:
        _require(session_id, "session_id")
        session = self.sessions.get(session_id)
        if session is None:
            self._check_lost(session_id)
            raise NotFound(f"no session {session_id!r}", field="session_id")
        return session

    def session_for(self, key: SessionKey) -> Session | None:
        session_id = self.session_ids.get(key)
        return None if session_id is None else self.sessions[session_id]

    def add_session(self, session: Session) -> None:
        self.sessions[session.id] = session
        self.session_ids[session.key] = session.id

    def pop_session(self, session_id: str) -> Session:
        session = self.session(session_id)
        del self.sessions[session_id]
        del self.session_ids[session.key]
        return session

    def buffer(self, buffer_id: str, field: str = "buffer_id") -> BufferRecord:
        _require(buffer_id, field)
        record = self.buffers.get(buffer_id)
        if record is None:
            self._check_lost(buffer_id, field)
            raise NotFound(f"no buffer {buffer_id!r}", field=field)
        return record

    def _check_lost(self, object_id: str, field: str | None = None) -> None:
        fault = self.lost.get(object_id)
        if fault is not None:
            raise DeviceFault(
                f"{object_id} was lost with device {fault.device} ({fault.message}); "
                "the device was replaced: load the pipeline again and write new buffers there",
                session=fault.session,
                device=fault.device,
                isolated=True,
                field=field,
            )

    def memory_in_use(self) -> int:
        buffers = sum(record.charged for record in self.buffers.values())
        return buffers + sum(session.scratch_bytes() for session in self.sessions.values())


def _require(value: str, field: str) -> None:
    if not value:
        raise InvalidRequest(f"{field} is empty", field=field)


class ClientTable:
    """Every attached client by id: the one place a call is routed to its client's state;
    and the clients that detached while their work is still waited for (``leaving``)."""

    def __init__(self) -> None:
        self._clients: dict[str, Client] = {}
        self._leaving: dict[str, Client] = {}

    def add(self, client: Client) -> None:
        self._clients[client.id] = client

    def get(self, client_id: str | None) -> Client:
        if not client_id:
            raise InvalidRequest(
                "this call needs an attached client: call Attach and send its client id",
                field="client_id",
            )
        client = self._clients.get(client_id)
        if client is None:
            raise NotFound(f"no attached client {client_id!r}", field="client_id")
        client.last_seen = time.monotonic()
        return client

    def find(self, client_id: str) -> Client | None:
        return self._clients.get(client_id)

    def leave(self, client_id: str) -> Client | None:
        """Detach: no call finds the client from now on; it is ``leaving`` until ``gone``."""
        client = self._clients.pop(client_id, None)
        if client is not None:
            self._leaving[client.id] = client
        return client

    def gone(self, client: Client) -> None:
        """A leaving client's resources were freed: forget it."""
        self._leaving.pop(client.id, None)

    @property
    def leaving(self) -> list[Client]:
        """Detached clients whose work is still waited for before their resources go."""
        return list(self._leaving.values())

    def __iter__(self) -> Iterator[Client]:
        return iter(list(self._clients.values()))

    def __len__(self) -> int:
        return len(self._clients)
