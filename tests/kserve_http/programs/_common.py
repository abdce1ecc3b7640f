"""What every HTTP example program takes: the door's host:port and, optionally, a bearer token.

These programs run under tritonclient's own environment, as a user of tritonclient.http
would write them (its upstream examples, with accy's names where they print Triton's).
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
    """``client``, closed at exit (its connection pool, before the interpreter ends)."""
    atexit.register(client.close)
    return client


def fail(message: str) -> None:
    print(f"error: {message}")
    raise SystemExit(1)
