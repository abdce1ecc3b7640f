"""What a ring needs of the core: the operations every front door calls, as a protocol."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from accyd.backends.base import Backend
from accyd.catalog.dtypes import Scalar
from accyd.catalog.model import ScalarSpec
from accyd.core.launching import BoundLaunch
from accyd.core.marks import MarkWatch
from accyd.errors import AccyError

__all__ = ["RingCore", "RingObserver", "Ticket"]


class Ticket(Protocol):
    @property
    def must_wait(self) -> bool: ...

    @property
    def watch(self) -> MarkWatch | None: ...


class RingCore(Protocol):
    """What a ring needs of the core: the operations every front door calls."""

    @property
    def backend(self) -> Backend: ...

    def launch(
        self,
        client_id: str,
        session_id: str,
        operands: Sequence[str],
        results: Sequence[str],
        scalars: Mapping[str, Scalar],
        *,
        watch: bool = False,
    ) -> Ticket: ...

    def reap(self, client_id: str, session_id: str) -> None: ...

    def bind_launch(
        self,
        client_id: str,
        session_id: str,
        operands: Sequence[str],
        results: Sequence[str],
        scalars: Mapping[str, Scalar],
    ) -> BoundLaunch | None: ...

    def launch_bound(self, bound: BoundLaunch, count: int = 1) -> bool: ...

    def newest_launch(self, client_id: str, session_id: str) -> MarkWatch | None: ...

    def launch_outcome(self, session_id: str, watch: MarkWatch) -> None: ...

    def session_scalars(self, client_id: str, session_id: str) -> tuple[ScalarSpec, ...]: ...

    def check_buffer(self, client_id: str, buffer_id: str) -> None: ...

    def touch(self, client_id: str) -> None: ...

    def frees_of(self, client_id: str) -> int: ...


class RingObserver(Protocol):
    """Who counts a ring's launches (the service's metrics); called by whoever takes its
    records, so it must be quick and must not raise."""

    def launched(self, client_id: str, session_id: str, count: int) -> None:
        """``count`` launch records of the session were checked and enqueued."""

    def refused(self, client_id: str, session_id: str | None, error: AccyError) -> None:
        """A launch record was refused (its session, if the record named a bound one)."""
