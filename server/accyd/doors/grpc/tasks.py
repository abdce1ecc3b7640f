"""Sets of tasks the service starts on the side (answers, detaches) and waits for as it ends."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Coroutine
from typing import Any

import structlog

from accyd.clipping import clip

__all__ = ["TaskSet"]

log = structlog.get_logger("accyd.doors.grpc")


class TaskSet:
    """Tasks started on the running loop and kept until done; ``settle`` waits for them all.

    Each task leaves the set by its own done-callback. ``settle`` waits only on
    tasks that are not done: from Python 3.12 on, gathering tasks that are done
    returns without yielding to the loop, so ``while tasks: await gather(*tasks)``
    spins forever on a task whose callback is still queued (it hung a daemon's
    stop after a CUDA fault).
    """

    __slots__ = ("_tasks",)

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def start(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``work`` as a task of this set."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def shielded(self, work: Coroutine[Any, Any, None], what: str) -> None:
        """Run ``work`` as a task of this set and await it, shielded from the caller's
        cancellation; the error it ends with after its caller was cancelled (nobody awaits
        it then) is a line of the log, not asyncio's stray traceback on stderr."""
        task = self.start(work)
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(functools.partial(_log_unheard, what))
            raise

    async def settle(self) -> None:
        """Return once every task (those started meanwhile too) is done; errors stay theirs."""
        while pending := [task for task in self._tasks if not task.done()]:
            await asyncio.gather(*pending, return_exceptions=True)

    def cancel(self) -> None:
        """Cancel every task not yet done."""
        for task in self._tasks:
            task.cancel()


def _log_unheard(what: str, task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (error := task.exception()) is not None:
        log.info(f"{what} ended after its call", error=clip(repr(error)))
