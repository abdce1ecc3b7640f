"""What every example program takes: the daemon's URL and, optionally, a bearer token.

These programs run under tritonclient's own environment (its grpc extra pins a protobuf
accy does not use), as a user of tritonclient would write them.
"""

from __future__ import annotations

import argparse
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


def fail(message: str) -> None:
    print(f"error: {message}")
    raise SystemExit(1)
