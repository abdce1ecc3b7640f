"""``accyd serve``: command-line flags over ``ACCYD_*`` settings, then the server."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import structlog

from accyd.backends.select import BACKEND_CHOICES
from accyd.config import Config
from accyd.errors import AccyError
from accyd.logs import configure_logging
from accyd.server import serve

__all__ = ["main", "parser"]


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="accyd", description="The accy GPU launch daemon.")
    top.add_argument("--version", action="version", version=f"accyd {version('accy')}")
    commands = top.add_subparsers(dest="command", required=True)
    run = commands.add_parser("serve", help="serve the launch service until SIGTERM or SIGINT")
    run.add_argument(
        "--listen",
        action="append",
        metavar="ADDR",
        help="unix:/path or host:port (repeatable); default: a Unix socket in the "
        "per-user runtime folder",
    )
    run.add_argument("--backend", choices=BACKEND_CHOICES, help="default: auto")
    run.add_argument("--device", action="append", type=int, help="GPU ordinal (repeatable)")
    run.add_argument("--catalog", action="append", type=Path, metavar="DIR")
    run.add_argument(
        "--no-builtin-catalog", action="store_true", help="serve only the --catalog folders"
    )
    run.add_argument("--log-format", choices=("console", "json"))
    run.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    run.add_argument("--cache-dir", type=Path, metavar="DIR", help="compiled kernel cache")
    run.add_argument(
        "--insecure", action="store_true", help="allow TCP without credentials (trusted networks)"
    )
    run.add_argument("--grace", type=float, metavar="SECONDS", help="drain time at shutdown")
    return top


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    flags: dict[str, Any] = {
        "listen": None if args.listen is None else tuple(args.listen),
        "backend": args.backend,
        "devices": None if args.device is None else tuple(args.device),
        "catalog_dirs": None if args.catalog is None else tuple(args.catalog),
        "builtin_catalog": False if args.no_builtin_catalog else None,
        "log_format": args.log_format,
        "log_level": args.log_level,
        "cache_dir": args.cache_dir,
        "insecure": True if args.insecure else None,
        "grace_seconds": args.grace,
    }
    return {name: value for name, value in flags.items() if value is not None}


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        config = Config.from_env(**_overrides(args))
    except (ValueError, TypeError) as error:
        print(f"accyd: {error}", file=sys.stderr)
        return 2
    configure_logging(config.log_format, config.log_level)
    try:
        return asyncio.run(serve(config))
    except AccyError as error:
        structlog.get_logger("accyd").error("cannot serve", error=str(error))
        return 1


if __name__ == "__main__":
    sys.exit(main())
