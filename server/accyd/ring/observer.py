"""Who hears of a ring's launches: ``RingObserver`` (the core a ring calls is ``Core``)."""

from __future__ import annotations

from typing import Protocol

from accyd.errors import AccyError

__all__ = ["RingObserver"]


class RingObserver(Protocol):
    """Who counts a ring's launches (the service's metrics); called by whoever takes its
    records, so it must be quick and must not raise."""

    def launched(self, client_id: str, session_id: str, count: int) -> None:
        """``count`` launch records of the session were checked and enqueued."""

    def refused(self, client_id: str, session_id: str | None, error: AccyError) -> None:
        """A launch record was refused (its session, if the record named a bound one)."""
