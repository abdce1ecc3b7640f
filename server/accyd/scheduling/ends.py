"""A launch's end as a door learns it: settle, notify, wait, and no thread waits for long.

A door that answers a launch once it is over (gRPC's waited ``Launch``, KServe's infer)
makes a ``LaunchEnd`` right after enqueueing the launch with ``watch=True``. The launch is
first polled on the event loop for a bounded moment (``spin_seconds``, about 100 µs: a
small launch is over by then, and answering it costs no thread hop); one still running
asks the backend for a notification (a host function on the session's stream calls back
onto the event loop), before any other work can be queued behind it. ``wait`` relies on
that notification for a short patience, then awaits the core's wait
(``wait_launch_async``, notified too, and polled for a lost device): the notification
saves the core's bookkeeping for short kernels, the core's wait serves long ones, and
neither holds a thread.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Protocol

from accyd.core.launching import LaunchTicket

__all__ = ["NOTIFY_PATIENCE_SECONDS", "LaunchEnd", "LaunchWaits"]

NOTIFY_PATIENCE_SECONDS = 0.005
"""How long a waiting launch relies on its own notification before the core's awaited wait."""


class LaunchWaits(Protocol):
    """The core's waits for a launch (``Daemon`` fits)."""

    def wait_launch(
        self, client_id: str, session_id: str, launch_id: str | None = None, *, reap: bool = True
    ) -> None: ...

    async def wait_launch_async(
        self, client_id: str, session_id: str, launch_id: str | None = None
    ) -> None: ...


def _resolve_soon(future: asyncio.Future[bool]) -> None:
    """From any thread: the launch finished; resolve ``future`` with True on its loop."""
    future.get_loop().call_soon_threadsafe(_resolve, future, True)


def _resolve(future: asyncio.Future[bool], finished: bool) -> None:
    if not future.done():
        future.set_result(finished)


class LaunchEnd:
    """One enqueued launch's end, on the event loop: settled (over already), notified soon,
    or else awaited through the core. Made on the loop, right after the launch."""

    __slots__ = ("_client_id", "_finished", "_launch_id", "_session_id", "_waits", "settled")

    def __init__(
        self, waits: LaunchWaits, client_id: str, ticket: LaunchTicket, spin_seconds: float
    ) -> None:
        self._waits = waits
        self._client_id = client_id
        self._session_id = ticket.session_id
        self._launch_id = ticket.launch_id
        self.settled = False
        """Over already (polled): the wait only reports errors."""
        self._finished: asyncio.Future[bool] | None = None
        """Resolved True by the backend's notification, False when its patience runs out."""
        watch = ticket.watch
        if watch is None:  # not watched (or on scratch of its own): the core's wait alone
            return
        try:
            self.settled = watch.settle(spin_seconds)
            if not self.settled:
                finished = asyncio.get_running_loop().create_future()
                if watch.notify(functools.partial(_resolve_soon, finished)):
                    self._finished = finished
        finally:
            watch.close()

    async def wait(self, *, reap: bool = True) -> None:
        """Until the launch is over; raises what it failed with. With ``reap`` false the
        caller drops the finished launch from its session's log (``Daemon.reap``) itself."""
        finished = self._finished
        if not self.settled and finished is not None:
            # A timer resolves the same future with False: no task, no shield, one wake-up.
            timer = finished.get_loop().call_later(
                NOTIFY_PATIENCE_SECONDS, _resolve, finished, False
            )
            try:
                self.settled = await finished
            finally:
                timer.cancel()
        if self.settled:  # over: this wait returns at once and reports any error
            self._waits.wait_launch(self._client_id, self._session_id, self._launch_id, reap=reap)
            return
        await self._waits.wait_launch_async(self._client_id, self._session_id, self._launch_id)
