"""Replacing an isolated device after its fault: what clients held there is lost, the rest stays."""

from __future__ import annotations

import contextlib

import structlog

from accyd.backends.base import Backend
from accyd.core.marks import Mark
from accyd.core.sessions import Reaped, Session
from accyd.core.tables import Tables
from accyd.core.tenants import Usage
from accyd.errors import AccyError, DeviceFault

__all__ = ["Replacing"]

log = structlog.get_logger("accyd.core")


class Replacing:
    """The facade's ``replace_device`` (the server calls it from a fault's own thread)."""

    def __init__(self, tables: Tables) -> None:
        self._t = tables

    def replace_device(self, device: int, backend: Backend) -> None:
        """*Blocking*: ``backend`` serves isolated ``device`` from now on, after its fault.

        Every attached client's sessions and buffers on the device are dropped, their
        usage refunded and their ids remembered as lost with the device's fault (calls
        naming them say so); the old backend is retired (the caller closes it, ending
        its worker process and everything it held). Clients that are leaving keep their
        teardown, which finds the old backend faulted. Nothing on other devices is touched.
        """
        dropped: list[Session] = []
        leftovers: list[Reaped] = []
        marks: list[Mark] = []
        self._t.partitions.split(device, backend)  # before any session may be made there
        with self._t.lock:
            old = self._t.backends[device]
            fault = self._t.state.replaced(device, old) or DeviceFault(
                "the device was replaced", device=device
            )
            lost = DeviceFault(fault.message, session=fault.session, device=device, isolated=True)
            for client in self._t.clients:
                memory = buffers = launches = descriptors = 0
                sessions = [s for s in client.sessions.values() if s.key.device == device]
                for session in sessions:
                    client.pop_session(session.id)
                    session.prepared.revoke_all()  # its tickets name the old device
                    client.lost[session.id] = lost
                    memory += session.scratch_bytes()
                    drained = session.drain()
                    launches += drained.launches
                    leftovers.append(drained)
                    dropped.append(session)
                for record in [r for r in client.buffers.values() if r.device == device]:
                    del client.buffers[record.id]
                    client.lost[record.id] = lost
                    record.closed = True
                    marks += record.take_marks()
                    memory += record.charged
                    descriptors += record.descriptors
                    buffers += 1
                client.transfer_streams.pop(device, None)
                self._t.ledger.refund(
                    client,
                    Usage(
                        memory_bytes=memory,
                        sessions=len(sessions),
                        buffers=buffers,
                        launches_in_flight=launches,
                        descriptors=descriptors,
                    ),
                )
            for leaving in self._t.clients.leaving:
                leaving.transfer_streams.pop(device, None)
            self._t.backends[device] = backend
        # The old backend is faulted: these free nothing on a device, only their handles.
        for mark in marks:
            mark.release()
        for drained in leftovers:
            with contextlib.suppress(AccyError):
                drained.close()
        for session in dropped:
            with contextlib.suppress(AccyError):
                session.close()
        log.warning(
            "device replaced",
            device=device,
            session_id=fault.session,
            sessions_lost=len(dropped),
            error=fault.message,
        )
