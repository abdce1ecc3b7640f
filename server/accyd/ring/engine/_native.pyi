"""Types of the native launch engine (``_native.c``)."""

from collections.abc import Sequence
from typing import Any

LAYOUT: dict[str, int]
SLOW_RECORD: int
SLOW_BROKEN: int
SLOW_LAUNCH_FAILED: int
SLOW_FAULT: int
MAX_DRIVERS: int
MAX_THREADS: int
MAX_BATCH: int
TICKETS_PER_RING: int
ERR_CALLBACK: int

Stream = tuple[int, int, int]
"""(driver, stream handle, session token)."""
FreeScalars = tuple[int, bytes, Sequence[int]]
"""(mask of free scalar fields, each field's value width, each field's exponent bits)."""
Ticket = (
    tuple[bytes, int, int, int, int, int, int]
    | tuple[bytes, int, int, int, int, int, int, FreeScalars | None]
)
"""(key, driver, exec handle, stream handle, session token, epoch, epoch value[, free])."""
SlowItem = tuple[int, int, int, int, int]
"""(kind, ring id, seq, error code, session token)."""

class Engine:
    slow_fd: int
    crowded: bool
    """Every thread serves its own lane; else the first ``base`` serve them all."""
    def __init__(
        self,
        threads: int = 1,
        batch: int = 64,
        epochs: int = ...,
        counters: int = ...,
        tokens: int = ...,
        spin_ns: int = 200000,
        flight_spin_ns: int = 2000000,
        idle_poll_ns: int = 50000,
        timings: bool = False,
        base: int = 0,
    ) -> None: ...
    def set_driver(
        self,
        index: int,
        kind: str,
        context: int = 0,
        launch: int = 0,
        event_create: int = 0,
        event_destroy: int = 0,
        event_record: int = 0,
        event_query: int = 0,
        patch: int = 0,
    ) -> None: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def add_ring(
        self,
        ring_id: int,
        memory: object,
        slots: int,
        submit_fd: int,
        complete_fd: int,
        counters: tuple[int, int],
        notify_always: bool = False,
        device: bool = False,
    ) -> None: ...
    def remove_ring(self, ring_id: int, /) -> None: ...
    def set_device(self, ring_id: int, on: bool, /) -> bool: ...
    def resume(
        self,
        ring_id: int,
        tail: int,
        streams: Sequence[Stream] | None = None,
        tickets: Sequence[Ticket] | None = None,
        clear: bool = False,
    ) -> None: ...
    def fault_done(self, ring_id: int, /) -> None: ...
    def take_slow(self, timeout: float = 0.0, /) -> list[SlowItem]: ...
    def bump(self, epoch: int, /) -> int: ...
    def epoch(self, epoch: int, /) -> int: ...
    def quiesce(self) -> None: ...
    def set_limit(self, counter: int, limit: int, /) -> None: ...
    def set_external(self, counter: int, count: int, /) -> None: ...
    def reset_counter(self, counter: int, /) -> None: ...
    def in_flight(self, counter: int, /) -> int: ...
    def set_serving(self, serving: bool, /) -> None: ...
    def set_device_ok(self, driver: int, ok: bool, /) -> None: ...
    def launched(self) -> list[tuple[int, int]]: ...
    def touched(self) -> list[int]: ...
    def stats(self) -> dict[str, Any]: ...
