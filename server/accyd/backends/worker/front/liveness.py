"""A worker that stops answering is lost: its channel watched for silence, the worker then killed.

A ready worker sends ``ALIVE`` every ``HEARTBEAT_SECONDS`` from a thread of its
own, whatever its ops are doing (``accyd.backends.worker.child.main``). The front's reader
notes when it began waiting for the next frame (``Channel.waiting_since``); a
channel that stays silent longer than ``hang_seconds`` belongs to a worker
that is stopped (SIGSTOP), hung or starved. Calls to it would wait forever
(nothing else bounds a round trip: a synchronize may rightly wait for a long
kernel), so the watchdog kills it: its channel then dies as a killed worker's
does, every call waiting wakes with a ``DeviceFault`` saying why, and the pool
replaces it as it replaces a faulted one. Time the reader spends running a
frame (a notification's callback) is not silence.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Protocol

import structlog

from accyd.backends.worker.protocol import HEARTBEAT_SECONDS

__all__ = ["DEFAULT_HANG_SECONDS", "MIN_HANG_SECONDS", "watch_liveness"]

log = structlog.get_logger("accyd.backends.worker")

DEFAULT_HANG_SECONDS = 5.0
"""How long a worker may stay silent before it is declared lost (20 heartbeats)."""
MIN_HANG_SECONDS = 4 * HEARTBEAT_SECONDS
"""The shortest bound that does not mistake a busy machine's scheduling for a hang."""


class Watched(Protocol):
    """What the watchdog needs of a ``Channel``."""

    name: str
    dead: bool

    @property
    def waiting_since(self) -> float | None: ...

    def declare_hung(self, reason: str) -> None: ...


def watch_liveness(channel: Watched, hang_seconds: float) -> threading.Thread:
    """Watch ``channel`` on a thread of its own until it is dead (or dropped)."""
    held = weakref.ref(channel)
    period = min(hang_seconds / 4, 0.5)

    def run() -> None:
        while True:
            time.sleep(period)
            watched = held()
            if watched is None or watched.dead:
                return
            since = watched.waiting_since
            if since is None:
                continue
            silent = time.monotonic() - since
            if silent > hang_seconds:
                reason = f"it stopped answering for {silent:.1f} s (stopped, hung or starved)"
                log.error("device worker silent; declaring it lost", worker=watched.name)
                watched.declare_hung(reason)
                return
            del watched

    thread = threading.Thread(target=run, name="accy-worker-liveness", daemon=True)
    thread.start()
    return thread
