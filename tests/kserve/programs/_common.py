"""What every example program takes: the daemon's URL and, optionally, a bearer token.

These programs run under tritonclient's own environment (its grpc extra pins a protobuf
accy does not use), as a user of tritonclient would write them.

Each closes its client at exit (``closed_at_exit``). A client left to the interpreter's
end is closed by its ``__del__`` while the interpreter finalizes, after grpc's own
threads are frozen: if one froze holding the channel's lock, ``close`` waits for it
forever (a finished simple_stream hung so once in 60 runs). ``atexit`` runs first.
"""

from __future__ import annotations

import argparse
import atexit
from collections.abc import Sequence
from typing import Any


def arguments(
    extra: Sequence[tuple[str, dict[str, Any]]] = (),
) -> tuple[argparse.Namespace, dict[str, str] | None]:
    parser = argparse.ArgumentParser()
    parser.add_argument("-u", "--url", required=True)
    parser.add_argument("--token")
    for name, options in extra:
        parser.add_argument(name, **options)
    args = parser.parse_args()
    headers = None if args.token is None else {"authorization": f"Bearer {args.token}"}
    return args, headers


def closed_at_exit(client: Any) -> Any:
    """``client``, closed by ``atexit`` (before the interpreter freezes grpc's threads)."""
    atexit.register(client.close)
    return client


def fail(message: str) -> None:
    print(f"error: {message}")
    raise SystemExit(1)
