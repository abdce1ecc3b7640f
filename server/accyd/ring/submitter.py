"""The submitter: one thread that takes every ring's records, enqueues them, and signals ends.

It spins while there is work (records to take or launches in flight) and for
``spin_seconds`` after, releasing the GIL between rounds so the gRPC event loop
keeps running; idle, it sleeps on the rings' ``submit`` eventfds (a client
wakes it only when it has said it sleeps, so a busy ring costs no system call).

Where this process may use ``SPIN_CPUS`` CPUs or more, it yields between
rounds with ``sched_yield`` (the GIL is let go in the call) rather than
``time.sleep(0)``: a sleep, even of zero, is a timer that Linux lets run late
by the thread's timer slack (50 µs by default), so each round of a "spin" that
sleeps takes about 60 µs and a record waits half of that on average. A thread
waiting for the GIL still gets it within tens of microseconds (measured: a
thread waking every millisecond ran 30 µs later at the median while a thread
spun so, against not before the 5 ms switch interval without the yield).
Launches in flight are then looked at in the same spin for
``flight_spin_seconds`` after the last progress, then every
``IDLE_POLL_SECONDS`` (a long kernel does not keep a core busy). On fewer
CPUs a spinning thread takes a core from the clients, the event loop and the
host backend's kernels, and is itself put off for milliseconds whenever
another process runs: there it naps between rounds, as a sleep does.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections.abc import Callable

import structlog

from accy.protocol import ring as layout
from accyd.ring.ring import ServerRing

__all__ = ["FLIGHT_SPIN_SECONDS", "SPIN_CPUS", "Submitter", "may_spin"]

log = structlog.get_logger("accyd.ring")

SPIN_CPUS = 8
"""From how many usable CPUs the submitter spins between rounds (see above)."""
FLIGHT_SPIN_SECONDS = 2e-3
"""On a device, how long after the last progress launches in flight are spun on."""
IDLE_POLL_SECONDS = 50e-6
"""With launches in flight for longer than ``flight_spin_seconds`` and nothing to take, how
long to sleep between looks (about 100 µs with the timer's slack)."""


def may_spin() -> bool:
    """Whether this process may use enough CPUs for the submitter to spin."""
    return len(os.sched_getaffinity(0)) >= SPIN_CPUS


class Submitter:
    """Owns the rings added to it (closes them on ``remove`` and ``stop``) and its thread."""

    def __init__(
        self,
        *,
        spin: bool | None = None,
        spin_seconds: float = 200e-6,
        flight_spin_seconds: float = FLIGHT_SPIN_SECONDS,
        batch: int = 64,
    ) -> None:
        self.spin = may_spin() if spin is None else spin
        """Yield between rounds with ``sched_yield`` (else a nap of about 60 µs)."""
        self.spin_seconds = spin_seconds
        """With nothing in flight, how long to keep looking for records before sleeping."""
        self.flight_spin_seconds = flight_spin_seconds if self.spin else 0.0
        """With launches in flight, how long after the last progress to keep spinning."""
        self.batch = batch
        self._rings: dict[str, ServerRing] = {}
        self._changes: list[Callable[[], None]] = []
        self._changes_lock = threading.Lock()
        self._wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._poll = select.epoll()
        self._poll.register(self._wake, select.EPOLLIN)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="accyd-ring-submitter", daemon=True)
        self.taken = 0

    def start(self) -> None:
        self._thread.start()

    def add(self, ring: ServerRing) -> None:
        self._change(lambda: self._add(ring))

    def remove(self, ring_id: str, done: threading.Event | None = None) -> None:
        """Close and forget a ring on the submitter's thread (``done`` is set after)."""

        def change() -> None:
            ring = self._rings.pop(ring_id, None)
            if ring is not None:
                with contextlib.suppress(OSError, ValueError):
                    self._poll.unregister(ring.memory.submit_fd)
                ring.close()
            if done is not None:
                done.set()

        self._change(change)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread, closing every ring; idempotent."""
        self._stopping = True
        self._signal()
        if self._thread.is_alive():
            self._thread.join(timeout)
        for ring in self._rings.values():
            ring.close()
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
        with contextlib.suppress(BlockingIOError, OSError):
            os.eventfd_write(self._wake, 1)

    def _add(self, ring: ServerRing) -> None:
        self._rings[ring.id] = ring
        self._poll.register(ring.memory.submit_fd, select.EPOLLIN)

    def _apply_changes(self) -> None:
        with self._changes_lock:
            changes, self._changes = self._changes, []
        for change in changes:
            change()

    def _run(self) -> None:
        monotonic = time.monotonic
        yield_gil = os.sched_yield if self.spin else _nap
        last_busy = monotonic()
        rings: tuple[ServerRing, ...] = ()
        while not self._stopping:
            if self._changes:
                self._apply_changes()
                rings = tuple(self._rings.values())
            busy = False
            in_flight = False
            for ring in rings:
                try:
                    if ring.take(self.batch):
                        busy = True
                    if ring.settle():
                        busy = True
                except Exception:
                    log.exception("ring failed", ring_id=ring.id, client_id=ring.client_id)
                    ring.broken = True
                in_flight = in_flight or ring.in_flight
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
        for ring in rings:
            ring.memory.set_u32(layout.DAEMON_WAITS, 1)
        # A record published before the flag was seen would otherwise wait for the next wake.
        if not any(ring.pending() for ring in rings):
            for fd, _ in self._poll.poll(1.0):
                if fd == self._wake:
                    with contextlib.suppress(BlockingIOError):
                        os.eventfd_read(self._wake)
        for ring in rings:
            with contextlib.suppress(ValueError):
                ring.memory.set_u32(layout.DAEMON_WAITS, 0)
                ring.memory.drain_submit()


def _nap() -> None:
    time.sleep(0)  # lets the GIL go for the timer's slack (about 60 µs)
