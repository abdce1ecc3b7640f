"""Small helpers of the server's lifecycle: a bounded shutdown step, the loop a caller is on,
whether a process (the supervisor) is alive."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable

import structlog

__all__ = ["alive", "on_loop", "within"]

log = structlog.get_logger("accyd.server")


async def within(step: Awaitable[object], seconds: float, what: str) -> None:
    """Await ``step`` for at most ``seconds``; past that, log and go on (it keeps running)."""
    try:
        await asyncio.wait_for(asyncio.shield(step), seconds)
    except TimeoutError:
        log.warning("stop step overran; going on without it", step=what, seconds=seconds)


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether the caller runs on ``loop``'s thread."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
