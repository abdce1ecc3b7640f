"""An asyncio event loop that polls for a moment before it sleeps: less latency per call.

Between a client's launches the daemon's event loop sleeps in ``epoll_wait``,
and each call then starts on a core that has gone idle: measured on the lent
H200's host, the same launch path costs 2-3x its hot-loop time (CUDA calls
take 15-19 µs each instead of 5). Polling without blocking for up to
``spin_seconds`` after each wake-up keeps the core busy across a client's
think time, as CUDA's own spin-wait and Linux's busy polling do, and cuts a
streamed launch's round trip by about a fifth; it costs up to that much CPU per
event while clients are active and nothing while the daemon is idle.

The server turns it on for the CUDA backend (``Config.loop_spin_for``, 500 µs
unless ``--loop-spin-us`` says otherwise) and leaves it off for the host
backend, whose kernels run on Python threads that need the GIL and a core. It
stops polling as it starts to stop, so the threads that finish a shutdown never
queue for the GIL behind it.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from typing import Any

__all__ = ["SpinSelector", "set_loop_spin", "spinning_loop"]


class SpinSelector(selectors.DefaultSelector):
    """The platform's selector (epoll on Linux), polling ``spin_seconds`` before it blocks."""

    def __init__(self, spin_seconds: float = 0.0) -> None:
        super().__init__()
        self.spin_seconds = spin_seconds

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        spin = self.spin_seconds
        if spin <= 0 or (timeout is not None and timeout <= 0):
            return super().select(timeout)
        started = time.perf_counter()
        end = started + (spin if timeout is None else min(spin, timeout))
        while True:
            ready = super().select(0)  # lets the GIL go in the system call
            if ready:
                return ready
            now = time.perf_counter()
            if now >= end:
                break
        if timeout is None:
            return super().select(None)
        return super().select(max(0.0, timeout - (now - started)))


def spinning_loop() -> asyncio.AbstractEventLoop:
    """A new selector event loop over a ``SpinSelector`` (not polling until told to)."""
    return asyncio.SelectorEventLoop(SpinSelector())


def set_loop_spin(loop: asyncio.AbstractEventLoop, seconds: float) -> bool:
    """Make ``loop`` poll for ``seconds`` before it sleeps; False if it is not a spinning loop."""
    selector: Any = getattr(loop, "_selector", None)  # the selector event loop's own
    if not isinstance(selector, SpinSelector):
        return False
    selector.spin_seconds = seconds
    return True
