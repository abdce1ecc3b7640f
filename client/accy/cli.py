"""The ``accy`` command line: list pipelines, show daemon status, run a pipeline, health check."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TextIO

import grpc

from accy import _table
from accy._cli_run import EXIT_CHECK_FAILED, UsageError, parse_scalar, run
from accy._credentials import TOKEN_ENV, channel_credentials
from accy._monitor import Monitor
from accy._rpc import SERVICE_NAME
from accy.client import DEFAULT_TIMEOUT, Client, open_channel, resolve_target
from accy.errors import (
    AccyError,
    CertificateNameMismatch,
    CertificateNotVerified,
    ClientCertificateRefused,
    DaemonUnreachable,
    DaemonWithoutTls,
    PermissionDenied,
    Unauthenticated,
    from_rpc_error,
)
from accy.protocol import UnsafeSocketFolder

__all__ = [
    "EXIT_CHECK_FAILED",
    "EXIT_DAEMON_ERROR",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "main",
    "status_text",
]

EXIT_USAGE = 2
"""Bad arguments (argparse's own code)."""
EXIT_UNREACHABLE = 3
"""No daemon answered at the target."""
EXIT_DAEMON_ERROR = 4
"""The daemon refused or failed a call."""

HEALTH_TIMEOUT = 3.0
"""Seconds ``accy health`` waits by default (containers probe it often)."""

_EPILOG = """\
target: --target, else $ACCY_TARGET, else the daemon's default Unix socket.
credentials: --token (or $ACCY_TOKEN) on every call; TLS with --tls-ca or --tls,
mutual TLS adds --tls-cert and --tls-key.
exit codes: 0 ok, 1 check failed or not serving, 2 usage, 3 no daemon, 4 daemon error."""


def cli_hint(error: AccyError) -> str:
    """What to do about ``error`` in this command's flags ("" where there is nothing to add).

    It takes the place of the library's own hint (worded for its arguments: ``token=``,
    ``tls_ca=``), so one message says each thing once."""
    if isinstance(error, CertificateNameMismatch):
        return (
            "dial a name the daemon's certificate carries (its subjectAltName), or pass that "
            "name with --tls-server-name"
        )
    if isinstance(error, ClientCertificateRefused):
        return "pass --tls-cert and --tls-key with a certificate its client CA signed"
    if isinstance(error, DaemonWithoutTls):
        return "leave out --tls, --tls-ca, --tls-cert and --tls-key for a daemon without TLS"
    if isinstance(error, CertificateNotVerified):
        return (
            "pass the CA that signed the daemon's certificate with --tls-ca, and the name the "
            "certificate carries with --tls-server-name where it is not the target's host"
        )
    if isinstance(error, DaemonUnreachable):
        hint = (
            "start one with `accyd serve`, or pass the address of a running one with --target "
            "(or set ACCY_TARGET)"
        )
        if "if it serves TLS" in error.hint:  # a plaintext channel to a TCP address
            hint += "; if it serves TLS, pass --tls-ca (or --tls for the system's roots)"
        return hint
    if isinstance(error, Unauthenticated):
        if "refused the token" in error.hint:
            return "pass one it accepts with --token (or ACCY_TOKEN)"
        return "this daemon wants a token: pass --token or set ACCY_TOKEN"
    if isinstance(error, PermissionDenied):
        return "pass a --token (or ACCY_TOKEN) whose scopes allow this call"
    return ""


def cli_message(error: AccyError) -> str:
    """``error`` as the CLI prints it: its hint, if any, worded for the command's flags."""
    hint = cli_hint(error)
    if hint:
        error.message = f"{error.bare}; {hint}"
        error.hint = hint
    return error.message if isinstance(error, DaemonUnreachable) else str(error)


# -- pipelines, status, health -----------------------------------------------------------


def _pipelines(monitor: Monitor, args: argparse.Namespace) -> int:
    infos = monitor.pipelines()
    if args.json:
        print(json.dumps([p.to_dict() for p in infos], indent=2))
        return 0
    rows = [
        [p.target, str(p.version), str(p.stage_count), ",".join(p.formats), p.signature()]
        for p in infos
    ]
    print(_table.plain(["pipeline", "version", "stages", "formats", "signature"], rows))
    return 0


def _status(monitor: Monitor, args: argparse.Namespace) -> int:
    status = monitor.status()  # not attached: the clients it reports are all others
    fields = {"target": monitor.target, **status.to_dict()}
    print(json.dumps(fields, indent=2) if args.json else status_text(fields))
    return 0 if status.serving else EXIT_CHECK_FAILED


def _reload(monitor: Monitor, args: argparse.Namespace) -> int:
    change = monitor.reload_catalog()
    if args.json:
        print(json.dumps(change, indent=2))
        return 0
    print(f"catalog generation {change['generation']}")
    for what in ("added", "replaced", "removed"):
        print(f"{what}: {', '.join(change[what]) or '-'}")
    return 0


def _value_text(name: str, value: Any) -> str:
    """One status value for people: sizes also in binary units, unset as ``-``."""
    if value is None:
        return "-"
    if isinstance(value, list | tuple):  # (a device's partitions): one item after another
        return (
            "; ".join(
                " ".join(f"{k}={v}" for k, v in item.items())
                if isinstance(item, dict)
                else str(item)
                for item in value
            )
            or "-"
        )
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if "memory" in name or name.endswith("bytes"):
        return f"{value} ({_table.bytes_text(value)})" if value >= 1024 else str(value)
    if name.endswith("seconds"):
        return _table.seconds_text(value)
    return str(value)


def _flat(prefix: str, value: Any) -> Iterator[tuple[str, Any]]:
    """``(dotted name, value)`` for every leaf of nested dicts."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _flat(f"{prefix}.{key}" if prefix else str(key), inner)
    else:
        yield prefix, value


def status_text(fields: Mapping[str, Any]) -> str:
    """Every status field as text: one table of values, then a table per list (tenants...)."""
    rows: list[list[str]] = []
    tables: list[str] = []
    for name, value in fields.items():
        if isinstance(value, list) and all(isinstance(item, dict) for item in value):
            items = [dict(_flat("", item)) for item in value]
            columns = list(dict.fromkeys(key for item in items for key in item))
            cells = [[_value_text(c, item.get(c)) for c in columns] for item in items]
            tables.append(f"{name}:\n" + _table.plain(columns, cells) if items else f"{name}: none")
            continue
        rows.extend([key, _value_text(key, leaf)] for key, leaf in _flat(name, value))
    return "\n\n".join([_table.plain(["field", "value"], rows), *tables])


def _health(
    target: str, credentials: grpc.ChannelCredentials | None, args: argparse.Namespace
) -> int:
    from grpc_health.v1 import health_pb2

    with open_channel(target, credentials, server_name=args.tls_server_name) as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            health_pb2.HealthCheckRequest.SerializeToString,
            health_pb2.HealthCheckResponse.FromString,
        )
        try:
            reply = check(health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout)
        except grpc.RpcError as error:
            code = error.code() if isinstance(error, grpc.Call) else None
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise DaemonUnreachable(target, error.details() or str(code)) from None
            if code == grpc.StatusCode.NOT_FOUND:
                print(
                    f"accy: the daemon at {target} reports no health for a service named "
                    f"{args.service!r}; leave out --service for the whole server, or name a "
                    f"service it serves, such as {SERVICE_NAME}",
                    file=sys.stderr,
                )
                return EXIT_DAEMON_ERROR
            raise from_rpc_error(error) from None
    state = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(state)
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else EXIT_CHECK_FAILED


# -- main ------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The ``accy`` argument parser (exposed for tests and documentation)."""
    parser = argparse.ArgumentParser(
        prog="accy",
        description="Client of the accy GPU launch daemon (accyd).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"accy {_version()}")
    parser.add_argument("--target", help="daemon address: unix:PATH or HOST:PORT")
    parser.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV),
        help=f"bearer token sent on every call (default: ${TOKEN_ENV})",
    )
    tls = parser.add_argument_group("TLS (for a daemon that serves TCP with --tls-cert)")
    tls.add_argument(
        "--tls", action="store_true", help="connect with TLS, trusting the system's CAs"
    )
    for flag, env, what in (
        ("--tls-ca", "ACCY_TLS_CA", "connect with TLS, trusting this CA file"),
        ("--tls-cert", "ACCY_TLS_CERT", "mutual TLS: this client's certificate file"),
        ("--tls-key", "ACCY_TLS_KEY", "mutual TLS: the key file of --tls-cert"),
    ):
        tls.add_argument(
            flag, metavar="PEM", default=os.environ.get(env), help=f"{what} (default: ${env})"
        )
    tls.add_argument(
        "--tls-server-name",
        metavar="NAME",
        help="the name the daemon's certificate must carry, where it is not the target's host",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"seconds each call may take (default {DEFAULT_TIMEOUT:g}; "
        f"{HEALTH_TIMEOUT:g} for health)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = commands.add_parser("pipelines", help="list the daemon's pipelines")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = commands.add_parser("status", help="show the daemon's state")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = commands.add_parser(
        "reload-catalog",
        help="have the daemon read its catalog folders again (admin token)",
        description="The daemon reads its --catalog folders again and serves them once "
        "every kernel is made; a broken manifest or kernel changes nothing. Sessions keep "
        "the pipeline they loaded until released.",
    )
    p.add_argument("--json", action="store_true", help="print JSON")

    p = commands.add_parser(
        "run", help="run a pipeline on random inputs (or .npy files) and time it", epilog=_EPILOG
    )
    p.add_argument("pipeline", help="pipeline target, e.g. accy.kernel.device_scan")
    p.add_argument("--n", type=int, help="the runtime scalar n (elements)")
    p.add_argument(
        "--scalar",
        action="append",
        type=parse_scalar,
        default=[],
        metavar="NAME=VALUE",
        help="a runtime scalar (repeatable); float scalars not given are drawn at random",
    )
    p.add_argument("--version", type=int, default=0, help="pipeline version (default newest)")
    p.add_argument("--format", default="", help="artifact format (default: the backend's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--repeat", type=int, default=1, help="launches to time (default 1)")
    p.add_argument(
        "--input",
        action="append",
        type=parse_scalar,
        default=[],
        metavar="NAME=FILE.npy",
        help="operand NAME from a .npy file of its dtype (repeatable); a scalar its length "
        "or dims give is read from it; operands not given are random",
    )
    p.add_argument(
        "--output", type=Path, metavar="DIR", help="save each result as DIR/NAME.npy, shaped"
    )
    p.add_argument("--check", action="store_true", help="compare with the numpy reference")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = commands.add_parser("health", help="ask the gRPC health service (for containers)")
    p.add_argument("--service", default="", help="service name (default: the whole server)")
    # The same flag after the subcommand; given before it, it must not be overwritten here.
    p.add_argument(
        "--timeout",
        type=float,
        default=argparse.SUPPRESS,
        help=f"seconds to wait (default {HEALTH_TIMEOUT:g})",
    )
    return parser


_MONITORING: dict[str, Callable[[Monitor, argparse.Namespace], int]] = {
    "pipelines": _pipelines,
    "status": _status,
    "reload-catalog": _reload,
}
"""Commands that only ask (a ``status`` token may run them): they do not attach."""
_COMMANDS: dict[str, Callable[[Client, argparse.Namespace], int]] = {
    "run": run,
}


def _version() -> str:
    try:
        return version("accy")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


class _Stderr:
    """Standard error, remembering whether the last write left a line open (a progress line)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.line_open = False

    def write(self, text: str) -> int:
        if text:
            self.line_open = not text.endswith("\n")
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.timeout is None:
        args.timeout = HEALTH_TIMEOUT if args.command == "health" else DEFAULT_TIMEOUT
    if args.command == "run" and args.repeat < 1:
        parser.error("--repeat must be at least 1")
    try:
        credentials = channel_credentials(
            tls=args.tls, tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key
        )
    except ValueError as error:
        parser.error(str(error))
    err = _Stderr(sys.stderr)
    with contextlib.redirect_stderr(err):
        try:
            return _command(args, credentials)
        except KeyboardInterrupt:
            print("\naccy: interrupted" if err.line_open else "accy: interrupted", file=err)
            return 130


def _command(args: argparse.Namespace, credentials: grpc.ChannelCredentials | None) -> int:
    """Run the command ``args`` name; errors printed as one message with its exit code."""
    try:
        target = resolve_target(args.target)
        if args.command == "health":
            return _health(target, credentials, args)
        options: dict[str, Any] = {
            "token": args.token,
            "timeout": args.timeout,
            "credentials": credentials,
            "tls_server_name": args.tls_server_name,
        }
        if args.command in _MONITORING:
            with Monitor(target, **options) as monitor:
                return _MONITORING[args.command](monitor, args)
        with Client(target, **options) as client:
            return _COMMANDS[args.command](client, args)
    except DaemonUnreachable as error:
        print(f"accy: {cli_message(error)}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except UnsafeSocketFolder as error:
        print(f"accy: {error}; or pass --target", file=sys.stderr)
        return EXIT_UNREACHABLE
    except UsageError as error:
        print(f"accy: {error}", file=sys.stderr)
        return EXIT_USAGE
    except AccyError as error:
        print(f"accy: {cli_message(error)}", file=sys.stderr)
        return EXIT_DAEMON_ERROR


if __name__ == "__main__":
    sys.exit(main())
