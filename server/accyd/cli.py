"""``accyd serve``: command-line flags over ``ACCYD_*`` settings, then the supervised server.

``accyd serve`` runs the server in a child process (the same command with
``--no-supervise``) and restarts it after a device fault or a crash; SIGTERM
and SIGINT are passed on for a graceful drain and a second one kills the
child. ``--no-supervise`` runs the server in this process, for service
managers and containers that restart it themselves. ``accyd hash-token`` and
``accyd new-token`` help write the tokens file. SIGUSR1 makes either process
print every thread's Python stack to stderr, for a daemon that seems stuck.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import os
import re
import signal
import sys
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from types import FrameType
from typing import Any

import structlog

from accyd.auth import hash_token, new_token
from accyd.backends.select import BACKEND_CHOICES
from accyd.config import Config
from accyd.errors import AccyError
from accyd.lineage import EXIT_DEVICE_LOST, EXIT_FORCED
from accyd.logs import configure_logging
from accyd.server import serve
from accyd.spinloop import spinning_loop
from accyd.supervisor import RestartPolicy, Supervisor

__all__ = ["main", "parser"]

_SIZE = re.compile(r"^\s*(\d+)\s*(|k|kib|m|mib|g|gib|t|tib)\s*$", re.IGNORECASE)
_UNITS = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}


def _size(text: str) -> int:
    """A byte count: ``1073741824``, ``1024MiB`` or ``1G`` (powers of 1024)."""
    match = _SIZE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"not a size: {text!r} (bytes, or a number and KiB/MiB/GiB)"
        )
    return int(match[1]) << _UNITS[match[2][:1].lower()]


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
    run.add_argument("--log-format", choices=("console", "json"), help="json for machines")
    run.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    run.add_argument("--cache-dir", type=Path, metavar="DIR", help="compiled kernel cache")
    run.add_argument("--grace", type=float, metavar="SECONDS", help="drain time at shutdown")
    run.add_argument(
        "--launch-spin-us",
        type=float,
        metavar="MICROSECONDS",
        help="poll a waited launch this long on the event loop before the driver calls back "
        "(default 100; 0: off)",
    )
    run.add_argument(
        "--loop-spin-us",
        type=float,
        metavar="MICROSECONDS",
        help="poll for calls this long before the event loop sleeps: lower latency for CPU "
        "time (default: 500 on the cuda backend, 0 (off) on the host backend)",
    )

    security = run.add_argument_group("security")
    security.add_argument(
        "--tokens",
        type=Path,
        metavar="FILE",
        help="bearer tokens file (TOML: tenants, token hashes, scopes, quotas); with it every "
        "call needs 'authorization: Bearer <token>' (health and reflection excepted)",
    )
    security.add_argument(
        "--unix-trusted",
        action="store_true",
        help="with --tokens: calls on the Unix socket without a token are the default tenant",
    )
    security.add_argument("--tls-cert", type=Path, metavar="PEM", help="TLS certificate (TCP)")
    security.add_argument("--tls-key", type=Path, metavar="PEM", help="TLS private key (TCP)")
    security.add_argument(
        "--tls-client-ca",
        type=Path,
        metavar="PEM",
        help="mutual TLS: TCP clients must present a certificate this CA signed",
    )
    security.add_argument(
        "--insecure",
        action="store_true",
        help="allow TCP without TLS and without tokens (trusted networks only)",
    )

    quotas = run.add_argument_group("default quotas (clients without a token; tokens without)")
    quotas.add_argument("--quota-memory", type=_size, metavar="BYTES", help="device memory")
    quotas.add_argument("--quota-sessions", type=int, metavar="N", help="sessions")
    quotas.add_argument("--quota-buffers", type=int, metavar="N", help="buffers")
    quotas.add_argument("--quota-launches", type=int, metavar="N", help="launches in flight")

    operation = run.add_argument_group("operation")
    operation.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics at http://ADDR:PORT/metrics (0 picks a port; default off)",
    )
    operation.add_argument(
        "--metrics-address", metavar="ADDR", help="where metrics listen (default 127.0.0.1)"
    )
    operation.add_argument(
        "--no-supervise",
        action="store_true",
        help="serve in this process, without restarts (for systemd or a container's restart "
        "policy)",
    )
    operation.add_argument(
        "--restart-max", type=int, metavar="N", help="most restarts within the window (10)"
    )
    operation.add_argument(
        "--restart-window", type=float, metavar="SECONDS", help="restart window (300)"
    )

    hashed = commands.add_parser(
        "hash-token", help="print the SHA-256 of a token, as the tokens file stores it"
    )
    hashed.add_argument("token", nargs="?", help="the token (default: read a line from stdin)")
    commands.add_parser("new-token", help="print a fresh random token and its SHA-256")
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
        "launch_spin_seconds": None if args.launch_spin_us is None else args.launch_spin_us / 1e6,
        "loop_spin_seconds": None if args.loop_spin_us is None else args.loop_spin_us / 1e6,
        "tokens_file": args.tokens,
        "unix_trusted": True if args.unix_trusted else None,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
        "tls_client_ca": args.tls_client_ca,
        "metrics_port": args.metrics_port,
        "metrics_address": args.metrics_address,
        "supervise": False if args.no_supervise else None,
        "restart_max": args.restart_max,
        "restart_window_seconds": args.restart_window,
    }
    return {name: value for name, value in flags.items() if value is not None}


def _quotas(args: argparse.Namespace) -> dict[str, int | None]:
    flags = {
        "memory_bytes": args.quota_memory,
        "sessions": args.quota_sessions,
        "buffers": args.quota_buffers,
        "launches_in_flight": args.quota_launches,
    }
    return {name: value for name, value in flags.items() if value is not None}


def _supervise(config: Config, argv: Sequence[str]) -> int:
    """Run ``accyd serve ... --no-supervise`` in a child until it stops; restart it on failure."""
    command = [sys.executable, "-m", "accyd.cli", *argv, "--no-supervise"]
    policy = RestartPolicy(
        max_restarts=config.restart_max, window_seconds=config.restart_window_seconds
    )
    child: list[int] = []

    def started(pid: int) -> None:
        child[:] = [pid]

    supervisor = Supervisor(command, policy, on_start=started)
    signals = 0

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            supervisor.stop(signum)  # passed on: the child drains gracefully
        else:
            structlog.get_logger("accyd.supervisor").warning("second signal; killing the server")
            for pid in child:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    code = supervisor.run(install_signal_handlers=False)
    return EXIT_FORCED if signals > 1 else code


def _serve(args: argparse.Namespace, argv: Sequence[str]) -> int:
    try:
        config = Config.from_env(quotas=_quotas(args), **_overrides(args))
    except (ValueError, TypeError) as error:
        print(f"accyd: {error}", file=sys.stderr)
        return 2
    configure_logging(config.log_format, config.log_level)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if config.supervise:
        return _supervise(config, argv)
    try:
        with asyncio.Runner(loop_factory=spinning_loop) as runner:
            code = runner.run(serve(config))
    except (AccyError, ValueError, OSError) as error:
        structlog.get_logger("accyd").error("cannot serve", error=str(error))
        return 1
    if code == EXIT_DEVICE_LOST:
        # Threads may be stuck in the poisoned device: do not wait for them at exit.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(arguments)
    if args.command == "hash-token":
        token = args.token if args.token is not None else sys.stdin.readline().strip()
        if not token:
            print("accyd: no token given", file=sys.stderr)
            return 2
        print(hash_token(token))
        return 0
    if args.command == "new-token":
        token = new_token()
        print(f"token:  {token}")  # for the client; it is stored nowhere
        print(f"sha256: {hash_token(token)}")  # for the tokens file
        return 0
    return _serve(args, arguments)


if __name__ == "__main__":
    sys.exit(main())
