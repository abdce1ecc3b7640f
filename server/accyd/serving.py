"""The ``accyd serve`` process: one ``Server`` run under its signals until it stops.

The first SIGTERM or SIGINT drains, a second forces the exit (under a supervisor the
supervisor forces), SIGHUP reloads the tokens file and the catalog. A failure before the server is
ready is ``NeverReady``, whose message says what to fix, without a traceback.
"""

from __future__ import annotations

import asyncio
import os
import signal

from accyd.errors import AccyError
from accyd.process.exits import EXIT_FORCED
from accyd.process.signals import capture_signals
from accyd.server import Server
from accyd.settings.config import Config

__all__ = ["NeverReady", "serve"]


class NeverReady(Exception):
    """The server failed before it served: its message says what to fix."""


async def serve(config: Config) -> int:
    """Run a server until SIGTERM or SIGINT (a second one forces exit); returns the exit status.

    SIGHUP reloads the tokens file and the catalog. A failure before the server is ready
    is ``NeverReady``.
    """
    server = Server(config)
    loop = asyncio.get_running_loop()

    def force(signum: signal.Signals) -> None:
        os._exit(EXIT_FORCED)

    # Under the supervisor a terminal's Ctrl-C or a service manager's SIGTERM reaches this
    # process twice (directly and passed on); the supervisor forces on a second signal itself.
    with capture_signals(
        drain=lambda signum: server.request_stop(signum.name),
        force=None if server.supervised else force,
        reload=lambda signum: server.reload(),
        loop=loop,
    ):
        try:
            await server.start()
        except Exception as error:
            raise NeverReady(_why(error)) from error
        return await server.wait()


def _why(error: Exception) -> str:
    """What a failure at start says to the operator (without a traceback)."""
    if isinstance(error, AccyError | OSError | ValueError):
        return str(error)
    return f"{type(error).__name__}: {error}"
