"""A session's last ring launch, kept for its next launch on the same buffers."""

from __future__ import annotations

from collections.abc import Sequence

from accy._link import Link
from accy._resources import Buffer
from accy._ring_path import Plan, RingPath

__all__ = ["KeptPlan", "keepable"]


class KeptPlan:
    """A session's last ring launch, for its next launch on the same buffers: no lookups,
    no checks but that nothing changed.

    Buffers are known again by ``id()``, and only ``Buffer`` objects are kept (never ids
    given as strings, which hold no handle): a buffer that goes away (freed, collected
    or lost) unbinds its handle or marks the ring's plans stale, which ``changes`` sees,
    so no new object at a dead buffer's address passes for it.
    """

    __slots__ = ("changes", "link", "operands", "plan", "results", "ring")

    def __init__(
        self,
        link: Link,
        ring: RingPath,
        plan: Plan,
        changes: int,
        operands: Sequence[Buffer | str],
        results: Sequence[Buffer | str],
    ) -> None:
        self.link = link
        self.ring = ring
        self.plan = plan
        self.changes = changes
        self.operands = tuple(map(id, operands))
        self.results = tuple(map(id, results))


def keepable(buffers: Sequence[Buffer | str]) -> bool:
    """Whether a ``KeptPlan`` may know these buffers again: ``Buffer`` objects only."""
    return all(type(b) is Buffer for b in buffers)
