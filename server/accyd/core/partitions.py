"""Tenants' SM partitions and stream priorities: where each tenant's session streams are made.

The tokens file names the partitions and each tenant's place (``accyd.token_placements``);
each device's backend splits its SMs once, at start (``Backend.split_sms``), and again on a
replacement backend after an isolated fault. A session's stream is made in its tenant's
partition where that device made it, at the tenant's priority; a tenant whose partition a
device could not make runs unconfined there, and status says why. Placements may change
when the tokens file is reloaded (new sessions follow them); partitions are made at start
only.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import structlog

from accyd.backends.base import Backend, Stream
from accyd.backends.partitions import PartitionSpec, SmSplit
from accyd.core.tenants import Placement

__all__ = ["PartitionStatus", "Partitions"]

log = structlog.get_logger("accyd.core")

_WHOLE = Placement()


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    """One partition on one device: its SMs and the sessions whose streams run in it."""

    name: str
    sms: int
    sessions: int
    tenants: tuple[str, ...]
    """Tenants placed in it."""


class Partitions:
    """The partitions asked for, what each device made of them, and each tenant's place."""

    def __init__(self) -> None:
        self.specs: tuple[PartitionSpec, ...] = ()
        self._placements: dict[str, Placement] = {}
        self._splits: dict[int, SmSplit] = {}
        self._lock = threading.Lock()

    def configure(
        self, specs: Sequence[PartitionSpec], placements: Mapping[str, Placement]
    ) -> None:
        """At start: the partitions to make and each tenant's place."""
        self.specs = tuple(specs)
        self.place_tenants(placements, specs)

    def place_tenants(
        self, placements: Mapping[str, Placement], specs: Sequence[PartitionSpec]
    ) -> None:
        """Each tenant's partition and priority from now on (a reloaded tokens file): new
        sessions follow them; a partition not made at start leaves its tenants unconfined.
        Partitions are made at start only: other ``specs`` are logged and left."""
        if tuple(specs) != self.specs:
            log.warning(
                "the tokens file's SM partitions changed; partitions are made at start: "
                "restart the daemon to make the new ones",
                made=[spec.name for spec in self.specs],
                asked=[spec.name for spec in specs],
            )
        with self._lock:
            self._placements = dict(placements)

    def split(self, device: int, backend: Backend) -> SmSplit:
        """*Blocking*: split ``device``'s SMs (at start, and on a replacement backend); says
        in one log line what was made, or why the device's tenants run unconfined."""
        if not self.specs:
            return SmSplit()
        made = backend.split_sms(self.specs)
        with self._lock:
            self._splits[device] = made
        if made.unconfined:
            log.warning(
                f"SM partitions not made on device {device}: {made.unconfined}; "
                "their tenants run unconfined",
                device=device,
            )
        else:
            shown = ", ".join(f"{p.name} {p.sms}" for p in made.partitions)
            log.info(
                f"SM partitions of device {device} ({made.total_sms} SMs): {shown}",
                device=device,
            )
        return made

    def placement(self, tenant: str) -> Placement:
        with self._lock:
            return self._placements.get(tenant, _WHOLE)

    def create_stream(self, backend: Backend, device: int, tenant: str, lowered: int = 0) -> Stream:
        """*Blocking*: a session's stream, in its tenant's partition where ``device`` has it,
        at its tenant's priority ``lowered`` levels down (never below 0: a caller may lower
        its work, never raise it past what the tokens file gave its tenant)."""
        place = self.placement(tenant)
        partition = place.partition
        if partition is not None and self.sms(device, partition) is None:
            partition = None
        return backend.create_stream(partition, max(0, place.priority - lowered))

    def sms(self, device: int, partition: str) -> int | None:
        with self._lock:
            split = self._splits.get(device)
        return None if split is None else split.sms_of(partition)

    def tenant_note(self, tenant: str) -> str:
        """What status says of a tenant's place: ``""`` (the whole device), the partition's
        name, or ``unconfined: <why>`` where a device did not make it."""
        place = self.placement(tenant)
        if place.partition is None:
            return ""
        with self._lock:
            splits = dict(self._splits)
        missing = [(d, s) for d, s in sorted(splits.items()) if s.sms_of(place.partition) is None]
        if not splits:
            return f"unconfined: partition {place.partition!r} not made yet"
        if not missing:
            return place.partition
        device, split = missing[0]
        why = split.unconfined or f"device {device} has no partition {place.partition!r}"
        return f"unconfined: {why}"

    def device_status(
        self, device: int, streams: Iterable[tuple[str, Stream]]
    ) -> tuple[tuple[PartitionStatus, ...], str]:
        """``device``'s partitions with their sessions (``streams``: each session's tenant
        and stream there), and why it has none (``""`` when it has, or none was asked)."""
        with self._lock:
            split = self._splits.get(device, SmSplit())
            placements = dict(self._placements)
        sessions: dict[str, int] = {}
        for _, stream in streams:
            if stream.partition is not None:
                sessions[stream.partition] = sessions.get(stream.partition, 0) + 1
        shown = tuple(
            PartitionStatus(
                p.name,
                p.sms,
                sessions.get(p.name, 0),
                tuple(sorted(t for t, place in placements.items() if place.partition == p.name)),
            )
            for p in split.partitions
        )
        return shown, split.unconfined
