"""``accyd serve``: command-line flags over ``ACCYD_*`` settings, then the supervised server.

``accyd serve`` runs the server in a child process (the same command with
``--no-supervise``) and restarts it after a device fault or a crash of a
server that had served; SIGTERM and SIGINT are passed on for a drain within
the grace, a second one kills the child, SIGHUP is passed on (the server
reloads its tokens file); ``accyd.process.signals`` holds the handlers.
``--no-supervise`` runs the server in this process, for service managers and
containers that restart it themselves. ``accyd hash-token`` and
``accyd new-token`` help write the tokens file; ``accyd check`` validates a catalog and
compiles its CUDA C++. SIGUSR1 makes either process
print every thread's Python stack to stderr, for a daemon that seems stuck.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import os
import signal
import sys
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import structlog

from accyd.logs import configure_logging
from accyd.process.event_loop import spinning_loop
from accyd.process.exits import EXIT_DEVICE_LOST, EXIT_FORCED, EXIT_NEVER_READY, EXIT_STOPPED_BUSY
from accyd.process.signals import capture_signals
from accyd.process.supervisor import RestartPolicy, Supervisor
from accyd.serving import NeverReady, serve
from accyd.settings.config import QUOTAS, SETTINGS, Config
from accyd.settings.config_file import CONFIG_ENV, read_config_file
from accyd.settings.fields import add_flags, flag_values, from_environment
from accyd.tokens import hash_token, new_token

__all__ = ["main", "parser"]


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="accyd", description="The accy GPU launch daemon.")
    top.add_argument("--version", action="version", version=f"accyd {version('accy')}")
    commands = top.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "serve",
        help="serve the launch service until SIGTERM or SIGINT",
        description="Serve the launch service until SIGTERM or SIGINT (a second one forces "
        "the exit; SIGHUP reloads the tokens file). Every flag has an environment variable "
        "and a key in the --config file (its name without --); a flag wins over its "
        "variable, a variable over the file.",
    )
    run.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="read settings from this TOML file: each key a flag's name without -- "
        '(listen = ["unix:/run/accy/accyd.sock"], metrics-port = 9464, insecure = true) '
        f"[env {CONFIG_ENV}; default none]",
    )
    add_flags(run, SETTINGS)
    add_flags(run, QUOTAS)

    hashed = commands.add_parser(
        "hash-token", help="print the SHA-256 of a token, as the tokens file stores it"
    )
    hashed.add_argument("token", nargs="?", help="the token (default: read a line from stdin)")
    commands.add_parser("new-token", help="print a fresh random token and its SHA-256")
    check = commands.add_parser(
        "check",
        help="validate a catalog and compile its CUDA C++ (no GPU needed)",
        description="Read every manifest under each --catalog folder as `accyd serve` would, "
        "and compile every cuda_cpp kernel with NVRTC for each --arch (default sm_80 and "
        "sm_90). Exit 0 when all pass, 1 when a kernel fails, 2 for a manifest error.",
    )
    check.add_argument("--catalog", action="append", type=Path, required=True, metavar="DIR")
    check.add_argument("--arch", action="append", default=[], metavar="sm_NN")
    check.add_argument("--json", action="store_true", help="one JSON object per line")
    return top


def _supervise(config: Config, argv: Sequence[str]) -> int:
    """Run ``accyd serve ... --no-supervise`` in a child until it stops; restart it on failure."""
    command = [sys.executable, "-m", "accyd.cli", *argv, "--no-supervise"]
    policy = RestartPolicy(
        max_restarts=config.restart_max, window_seconds=config.restart_window_seconds
    )
    if config.log_format == "json":
        # gRPC's C core writes lines of its own to stderr (one per refused TLS handshake),
        # which are not JSON: the server is started with them off unless the operator
        # asked for them.
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    supervisor = Supervisor(command, policy)
    # The child drains on the first signal (passed on) and reloads on SIGHUP; a second
    # signal kills it. A terminal's Ctrl-C reaches the child too: it ignores a second one.
    with capture_signals(drain=supervisor.stop, force=supervisor.kill, reload=supervisor.forward):
        code = supervisor.run()
    return EXIT_FORCED if supervisor.forced else code


def _config(args: argparse.Namespace) -> Config:
    """Defaults, then the --config file, then ``ACCYD_*`` variables, then flags."""
    named = args.config or os.environ.get(CONFIG_ENV)
    settings: dict[str, Any] = {}
    quotas: dict[str, Any] = {}
    if named:
        settings, quotas = read_config_file(Path(named), SETTINGS, QUOTAS)
        # Config.from_env reads the variables itself and lets what it is given win over
        # them: it is given only what no variable sets.
        for name in from_environment(SETTINGS, os.environ):
            settings.pop(name, None)
        for name in from_environment(QUOTAS, os.environ):
            quotas.pop(name, None)
    settings.update(flag_values(args, SETTINGS))
    quotas.update(flag_values(args, QUOTAS))
    return Config.from_env(quotas=quotas, **settings)


def _serve(args: argparse.Namespace, argv: Sequence[str]) -> int:
    try:
        config = _config(args)
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
    except NeverReady as error:
        # One line, no traceback: a restart would fail the same way (the supervisor knows).
        structlog.get_logger("accyd").error("cannot serve", error=str(error))
        return EXIT_NEVER_READY
    if code in (EXIT_DEVICE_LOST, EXIT_STOPPED_BUSY):
        # Threads may be stuck in the device or in work that never ends: do not wait for them.
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
    if args.command == "check":
        from accyd.checking import main_check  # NVRTC's bindings load only for this command

        return main_check(args.catalog, args.arch, args.json)
    return _serve(args, arguments)


if __name__ == "__main__":
    sys.exit(main())
