"""The submitter: one thread that takes every ring's records, enqueues them, and signals ends.

It spins while there is work (records to take or launches in flight) and for
``spin_seconds`` after, releasing the GIL between rounds so the gRPC event loop
keeps running; idle, it sleeps on the rings' ``submit`` eventfds (a client
wakes it only when it has said it sleeps, so a busy ring costs no system call).
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

__all__ = ["Submitter"]

log = structlog.get_logger("accyd.ring")

IDLE_POLL_SECONDS = 50e-6
"""With launches in flight but nothing to take, how long to sleep between looks."""


class Submitter:
    """Owns the rings added to it (closes them on ``remove`` and ``stop``) and its thread."""

    def __init__(self, *, spin_seconds: float = 200e-6, batch: int = 64) -> None:
        self.spin_seconds = spin_seconds
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
        last_busy = time.monotonic()
        while not self._stopping:
            if self._changes:
                self._apply_changes()
            busy = False
            in_flight = False
            for ring in list(self._rings.values()):
                try:
                    if ring.take(self.batch):
                        busy = True
                    if ring.settle():
                        busy = True
                except Exception:
                    log.exception("ring failed", ring_id=ring.id, client_id=ring.client_id)
                    ring.broken = True
                in_flight = in_flight or ring.in_flight
            now = time.monotonic()
            if busy:
                last_busy = now
                time.sleep(0)  # let the event loop in between rounds
            elif now - last_busy < self.spin_seconds:
                time.sleep(0)
            elif in_flight:
                time.sleep(IDLE_POLL_SECONDS)
            else:
                self._sleep()
                last_busy = time.monotonic()
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
