"""The Python engine: one thread takes every ring's records and has the core decide each one.

It serves where the native engine cannot (not built, or ``ACCYD_ENGINE=python``): the
same rings, records and answers, with every record checked in full by its
``ServerRing`` and nothing ticketed. After each batch it records one mark per session
stream the batch used, and advances ``done`` past a batch once its marks are over.

It spins while there is work (records to take or launches in flight) and for
``spin_seconds`` after, releasing the GIL between rounds so the gRPC event loop keeps
running; idle, it sleeps on the rings' ``submit`` eventfds (a client wakes it only
when it has said it sleeps, so a busy ring costs no system call). Where this process
may use ``SPIN_CPUS`` CPUs or more it yields with ``sched_yield`` (a ``sleep(0)`` runs
about 60 µs late by the timer's slack); on fewer it naps instead, and launches in
flight past ``flight_spin_seconds`` are looked at every ``IDLE_POLL_SECONDS``.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from accy.protocol import ring as layout
from accyd.backends.base import Backend
from accyd.core.interface import Core
from accyd.core.marks import Mark
from accyd.errors import AccyError, DeviceFault
from accyd.ring.memory import RingMemory
from accyd.ring.observer import RingObserver
from accyd.ring.ring import Handled, Pending, ServerRing

__all__ = ["FLIGHT_SPIN_SECONDS", "IDLE_SPIN_SECONDS", "SPIN_CPUS", "PythonLoop", "may_spin"]

log = structlog.get_logger("accyd.ring.engine")

SPIN_CPUS = 8
"""From how many usable CPUs the loop spins between rounds (see above)."""
FLIGHT_SPIN_SECONDS = 2e-3
"""On a device, how long after the last progress launches in flight are spun on."""
IDLE_SPIN_SECONDS = 200e-6
"""On a device, how long an engine thread spins on its rings after their last record before
it sleeps (their clients then kick it). Both engines' default."""
IDLE_POLL_SECONDS = 50e-6
TOUCH_SECONDS = 0.05
"""How often a busy ring tells the core its client is alive (liveness is judged in seconds)."""


def may_spin() -> bool:
    """Whether this process may use enough CPUs for the loop to spin."""
    return len(os.sched_getaffinity(0)) >= SPIN_CPUS


@dataclass(slots=True)
class _Flight:
    end: int
    marks: list[tuple[str, int, Mark]]
    """(session, device, a mark after the batch's launches on its stream)."""
    reap: set[str]


@dataclass(eq=False, slots=True)
class _Taken:
    """A ring as the loop takes it: its counters and its batches in flight."""

    ring: ServerRing
    notify_always: bool
    tail: int = 0
    done: int = 0
    flights: deque[_Flight] = field(default_factory=deque)
    pending: tuple[int, Pending] | None = None
    touched: float = 0.0


class PythonLoop:
    """Owns the rings added to it (closes them on ``remove`` and ``close``) and its thread."""

    kind = "python"
    threads = 1
    max_threads = 1

    def __init__(
        self,
        core: Core,
        *,
        spin: bool | None = None,
        spin_seconds: float = IDLE_SPIN_SECONDS,
        flight_spin_seconds: float = FLIGHT_SPIN_SECONDS,
        batch: int = 64,
        observer: RingObserver | None = None,
    ) -> None:
        self._core = core
        self._observer = observer
        self.spin = may_spin() if spin is None else spin
        self.spin_seconds = spin_seconds
        self.flight_spin_seconds = flight_spin_seconds if self.spin else 0.0
        self.batch = batch
        self._rings: dict[str, _Taken] = {}
        self._changes: list[Callable[[], None]] = []
        self._changes_lock = threading.Lock()
        self._wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._poll = select.epoll()
        self._poll.register(self._wake, select.EPOLLIN)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="accyd-ring-loop", daemon=True)
        self.taken = 0

    def start(self) -> None:
        self._thread.start()

    def crowded(self, crowded: bool) -> None:
        """Nothing: one thread takes every ring."""

    def watch_served(self, told: Callable[[RingMemory, bool], None]) -> None:
        """Nothing: the GPU serves no ring of this loop's."""

    def stats(self) -> dict[str, int]:
        return {"slow_records": self.taken, "rings": len(self._rings), "threads": 1}

    def settled(self) -> bool:
        # The loop's thread changes the table; a copy of its values is taken at once.
        return all(taken.ring.settled() for taken in list(self._rings.values()))

    def add(self, ring: ServerRing, *, notify_always: bool = False) -> None:
        taken = _Taken(ring, notify_always)
        self._change(lambda: self._add(taken))

    def remove(self, ring: ServerRing) -> None:
        """Close and forget a ring on the loop's thread; returns once it is closed."""
        done = threading.Event()

        def change() -> None:
            taken = self._rings.pop(ring.id, None)
            if taken is not None:
                with contextlib.suppress(OSError, ValueError):
                    self._poll.unregister(ring.memory.submit_fd)
                self._drop(taken)
            else:  # never taken (or an add still queued behind this: it finds it closed)
                ring.close()
            done.set()

        self._change(change)
        if self._thread.is_alive():
            done.wait(5.0)
        else:
            self._apply_changes()

    def close_client(self, client_id: str) -> None:
        """Nothing: the doors remove a client's rings, and its counter goes with it."""

    def device_replaced(self, device: int, backend: Backend) -> None:
        """Nothing: every record is launched through the core, which knows the new backend."""

    def close(self) -> None:
        """Stop the thread, closing every ring; idempotent."""
        self._stopping = True
        self._signal()
        if self._thread.is_alive():
            self._thread.join(5.0)
        self._apply_changes()
        for taken in self._rings.values():
            self._drop(taken)
        self._rings.clear()
        with contextlib.suppress(OSError):
            self._poll.close()
            os.close(self._wake)

    # The thread -------------------------------------------------------------------

    def _change(self, change: Callable[[], None]) -> None:
        with self._changes_lock:
            self._changes.append(change)
        self._signal()

    def _signal(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError, ValueError):
            os.eventfd_write(self._wake, 1)

    def _add(self, taken: _Taken) -> None:
        memory = taken.ring.memory
        taken.tail = memory.u64(layout.TAIL)
        taken.done = memory.u64(layout.DONE)
        self._rings[taken.ring.id] = taken
        self._poll.register(memory.submit_fd, select.EPOLLIN)

    def _drop(self, taken: _Taken) -> None:
        for flight in taken.flights:
            for _, _, mark in flight.marks:
                mark.release()
        taken.flights.clear()
        taken.ring.close()

    def _apply_changes(self) -> None:
        with self._changes_lock:
            changes, self._changes = self._changes, []
        for change in changes:
            change()

    def _run(self) -> None:
        monotonic = time.monotonic
        yield_gil = os.sched_yield if self.spin else _nap
        last_busy = monotonic()
        rings: tuple[_Taken, ...] = ()
        while not self._stopping:
            if self._changes:
                self._apply_changes()
                rings = tuple(self._rings.values())
            busy = False
            in_flight = False
            for taken in rings:
                try:
                    if self._take(taken):
                        busy = True
                    if self._settle(taken):
                        busy = True
                except Exception:
                    log.exception(
                        "ring failed", ring_id=taken.ring.id, client_id=taken.ring.client_id
                    )
                    taken.ring.broken = True
                in_flight = in_flight or bool(taken.flights) or taken.pending is not None
            if busy:
                last_busy = monotonic()
                yield_gil()  # let the event loop in between rounds
                continue
            idle = monotonic() - last_busy
            if idle < self.spin_seconds or (in_flight and idle < self.flight_spin_seconds):
                yield_gil()
            elif in_flight:
                time.sleep(IDLE_POLL_SECONDS)
            else:
                self._sleep()
                last_busy = monotonic()
        self._apply_changes()

    def _sleep(self) -> None:
        rings = list(self._rings.values())
        for taken in rings:
            taken.ring.memory.set_u32(layout.DAEMON_WAITS, 1)
        # A record published before the flag was seen would otherwise wait for the next wake.
        if not any(self._pending(taken) for taken in rings):
            for fd, _ in self._poll.poll(1.0):
                if fd == self._wake:
                    with contextlib.suppress(BlockingIOError):
                        os.eventfd_read(self._wake)
        for taken in rings:
            with contextlib.suppress(ValueError):
                taken.ring.memory.set_u32(layout.DAEMON_WAITS, 0)
                taken.ring.memory.drain_submit()

    @staticmethod
    def _pending(taken: _Taken) -> bool:
        if taken.ring.broken or taken.ring.abandoned or taken.pending is not None:
            return False
        return taken.ring.memory.u64(layout.HEAD) != taken.tail

    # Taking and settling ------------------------------------------------------------

    def _take(self, taken: _Taken) -> int:
        """Decide up to ``batch`` published records; how many."""
        ring = taken.ring
        if ring.broken or ring.abandoned:
            return 0
        decided: list[Handled] = []
        if taken.pending is not None:
            seq, pending = taken.pending
            if not pending.done():
                return 0
            taken.pending = None
            decided.append(pending.result())
            self._flight(taken, decided, seq + 1)
            decided = []
        memory = ring.memory
        head = memory.u64(layout.HEAD)
        tail = taken.tail
        ahead = head - tail
        if ahead == 0:
            return 0
        if not 0 < ahead <= memory.slot_count:
            ring.break_off(tail, f"head {head} is not within one ring of the tail {tail}")
            return 0
        count = min(ahead, self.batch)
        records = memory.records(tail, count)
        for index in range(count):
            at = index * layout.SLOT_SIZE
            if ring.abandoned:  # its client left meanwhile: the rest is not decided
                break
            outcome = ring.handle(tail + index, records[at : at + layout.SLOT_SIZE])
            if isinstance(outcome, Pending):  # nothing after it until it is over
                taken.pending = (tail + index, outcome)
                break
            decided.append(outcome)
        self.taken += len(decided)
        self._flight(taken, decided, tail + len(decided))
        return len(decided) + (taken.pending is not None)

    def _flight(self, taken: _Taken, decided: list[Handled], end: int) -> None:
        """Records up to ``end`` are taken: one mark per session stream they used."""
        streams: dict[str, tuple[int, Handled]] = {}
        counts: dict[str, int] = {}
        reap = set()
        for handled in decided:
            if handled.session_id is None or handled.stream is None:
                continue
            streams[handled.session_id] = (handled.device, handled)
            counts[handled.session_id] = counts.get(handled.session_id, 0) + 1
            if handled.reap:
                reap.add(handled.session_id)
        backends = self._core.backends
        marks = []
        for session_id, (device, handled) in streams.items():
            assert handled.stream is not None
            with contextlib.suppress(AccyError):  # a lost device: its entry comes at settle
                marks.append((session_id, device, Mark(backends[device], handled.stream)))
        if end != taken.tail:
            taken.flights.append(_Flight(end, marks, reap))
            taken.tail = end
            taken.ring.memory.set_u64(layout.TAIL, end)
            if taken.notify_always:
                taken.ring.memory.wake_client()
        client_id = taken.ring.client_id
        if self._observer is not None:
            for session_id, count in counts.items():
                self._observer.launched(client_id, session_id, count)
        now = time.monotonic()
        if now - taken.touched >= TOUCH_SECONDS:
            taken.touched = now
            self._core.touch(client_id)

    def _settle(self, taken: _Taken) -> bool:
        """Advance ``done`` past every finished batch; whether it moved."""
        moved = False
        flights = taken.flights
        ring = taken.ring
        while flights:
            flight = flights[0]
            if not all(_over(mark) for _, _, mark in flight.marks):
                break
            for session_id, device, mark in flight.marks:
                try:
                    mark.wait()
                except DeviceFault as fault:
                    ring.fault(flight.end - 1, fault, session_id, device)
                except AccyError as error:
                    ring.refuse_launch(flight.end - 1, error, session_id)
                finally:
                    mark.release()
            for session_id in flight.reap:
                self._core.reap(ring.client_id, session_id)
            flights.popleft()
            taken.done = flight.end
            moved = True
        if moved:
            memory = ring.memory
            memory.set_u64(layout.DONE, taken.done)
            if taken.notify_always or memory.u32(layout.CLIENT_WAITS):
                memory.wake_client()
        return moved


def _over(mark: Mark) -> bool:
    try:
        return mark.done()
    except AccyError:
        return True


def _nap() -> None:
    time.sleep(0)  # lets the GIL go for the timer's slack (about 60 µs)
