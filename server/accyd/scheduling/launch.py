"""The launch contract at a door: the one place a door handles ``WouldBlock``.

``Daemon.launch`` never blocks its caller; a launch that must allocate scratch of its own
raises ``WouldBlock`` with the rest of the launch (``finish``, *blocking*). Every door
launches through ``launch_or_defer`` (a thread that must not block: the ring's) or
``launched`` (the event loop: gRPC, KServe), which run that rest on the device-work
threads within the client's share, never on the caller's thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future
from typing import ParamSpec

from accyd.core.launching import LaunchTicket, WouldBlock
from accyd.scheduling.device_work import DeviceWork

__all__ = ["launch_or_defer", "launched"]

_P = ParamSpec("_P")


def launch_or_defer(
    work: DeviceWork,
    owner: str,
    launch: Callable[_P, LaunchTicket],
    *args: _P.args,
    **kwargs: _P.kwargs,
) -> LaunchTicket | Future[LaunchTicket]:
    """``launch(...)``'s ticket, enqueued at once; or, if it would block, its rest given to
    the device-work threads within ``owner``'s share: that ticket's future."""
    try:
        return launch(*args, **kwargs)
    except WouldBlock as blocked:
        return work.submit_for(owner, blocked.finish)


async def launched(
    work: DeviceWork,
    owner: str,
    launch: Callable[_P, LaunchTicket],
    *args: _P.args,
    **kwargs: _P.kwargs,
) -> LaunchTicket:
    """``launch_or_defer`` on the event loop: the ticket, awaited if it had to allocate."""
    ticket = launch_or_defer(work, owner, launch, *args, **kwargs)
    if isinstance(ticket, Future):
        return await asyncio.wrap_future(ticket)
    return ticket
