"""Signals in one place: the first SIGTERM or SIGINT drains, the second forces, SIGHUP reloads.

``capture_signals`` installs the handlers for the block it guards and puts the
original handlers back after it, so a process (or a test) that runs a server or
a supervisor in its main thread keeps its own handlers afterwards. On an event
loop the handlers go through ``loop.add_signal_handler``: they run on the loop,
which a signal wakes at once; elsewhere they run in the main thread between
two bytecodes (which a blocked ``waitpid`` does not delay).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator
from types import FrameType

import structlog

__all__ = ["STOP_SIGNALS", "capture_signals"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

log = structlog.get_logger("accyd.process.signals")

_Handler = Callable[[signal.Signals], None]


@contextlib.contextmanager
def capture_signals(
    *,
    drain: _Handler,
    force: _Handler | None = None,
    reload: _Handler | None = None,
    loop: asyncio.AbstractEventLoop | None = None,
) -> Iterator[None]:
    """Within the block: the first stop signal calls ``drain``, later ones ``force``.

    ``force=None`` ignores later stop signals (a supervised server: its
    supervisor forces). ``reload`` handles SIGHUP; without it SIGHUP keeps its
    handler. ``loop``: install on that loop (it must run in the main thread).
    """
    received = 0

    def on_stop(signum: signal.Signals) -> None:
        nonlocal received
        received += 1
        if received == 1:
            log.info("stop signal; draining", signal=signum.name)
            drain(signum)
        elif force is not None:
            log.warning("second stop signal; forcing the stop", signal=signum.name)
            force(signum)

    handlers: dict[signal.Signals, _Handler] = dict.fromkeys(STOP_SIGNALS, on_stop)
    if reload is not None:
        handlers[signal.SIGHUP] = reload
    originals = {signum: signal.getsignal(signum) for signum in handlers}
    for signum, handler in handlers.items():
        if loop is not None:
            loop.add_signal_handler(signum, handler, signum)
        else:
            signal.signal(signum, _plain(handler))
    try:
        yield
    finally:
        for signum, original in originals.items():
            if loop is not None:
                loop.remove_signal_handler(signum)
            signal.signal(signum, original if original is not None else signal.SIG_DFL)


def _plain(handler: _Handler) -> Callable[[int, FrameType | None], None]:
    def called(signum: int, frame: FrameType | None) -> None:
        handler(signal.Signals(signum))

    return called
