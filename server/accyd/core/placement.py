"""Placement: which device a client's sessions and buffers go to when it names none."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from accyd.backends.base import Backend
from accyd.core.clients import Client
from accyd.core.device import DeviceHealth

__all__ = ["DeviceLoad", "home_of", "load_of", "place"]


class DeviceLoad:
    """What one device holds for the clients, from the core's own tables (no device call)."""

    __slots__ = ("buffers", "clients", "homed", "launches_in_flight", "memory", "sessions")

    def __init__(self) -> None:
        self.homed = 0
        """Clients placed there by default."""
        self.clients = 0
        """Clients with a session or buffer there."""
        self.sessions = 0
        self.buffers = 0
        self.memory = 0
        """Bytes of buffers and session scratch charged there."""
        self.launches_in_flight = 0


def load_of(devices: Iterable[int], clients: Iterable[Client]) -> dict[int, DeviceLoad]:
    """Under the core's lock: each device's load."""
    loads = {device: DeviceLoad() for device in devices}
    for client in clients:
        if client.home_device in loads:
            loads[client.home_device].homed += 1
        seen: set[int] = set()
        for session in client.sessions.values():
            load = loads.get(session.key.device)
            if load is not None:
                load.sessions += 1
                load.memory += session.scratch_bytes()
                load.launches_in_flight += session.launches_in_flight
                seen.add(session.key.device)
        for record in client.buffers.values():
            load = loads.get(record.device)
            if load is not None:
                load.buffers += 1
                load.memory += record.charged
                seen.add(record.device)
        for device in seen:
            loads[device].clients += 1
    return loads


def place(backends: Mapping[int, Backend], clients: Iterable[Client], state: DeviceHealth) -> int:
    """Under the core's lock: the least-loaded serving device (fewest clients homed there,
    then the least memory held, then the lowest index); a lost device only if all are."""
    loads = load_of(backends, clients)
    serving = [device for device in loads if device not in state.lost] or list(loads)
    return min(serving, key=lambda d: (loads[d].homed, loads[d].memory, d))


def home_of(
    client: Client, backends: Mapping[int, Backend], clients: Iterable[Client], state: DeviceHealth
) -> int:
    """Under the core's lock: ``client``'s home device, placed (``place``) at its first
    request that names none."""
    if client.home_device is None:
        client.home_device = place(backends, clients, state)
    return client.home_device
