"""The ``accy`` command line: list pipelines, show daemon status, run a pipeline, health check."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import grpc
import numpy as np

from accy import _table, references
from accy._chunks import Progress
from accy._credentials import TOKEN_ENV, channel_credentials
from accy._extent import ExtentError
from accy._models import BufferSpec, PipelineInfo
from accy.client import Buffer, Client, open_channel, resolve_target
from accy.errors import (
    AccyError,
    CertificateNotVerified,
    DaemonUnreachable,
    PermissionDenied,
    Unauthenticated,
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

EXIT_CHECK_FAILED = 1
"""``--check`` found a result outside tolerance, or ``health`` found the daemon not serving."""
EXIT_USAGE = 2
"""Bad arguments (argparse's own code)."""
EXIT_UNREACHABLE = 3
"""No daemon answered at the target."""
EXIT_DAEMON_ERROR = 4
"""The daemon refused or failed a call."""

_EPILOG = """\
target: --target, else $ACCY_TARGET, else the daemon's default Unix socket.
credentials: --token (or $ACCY_TOKEN) on every call; TLS with --tls-ca or --tls,
mutual TLS adds --tls-cert and --tls-key.
exit codes: 0 ok, 1 check failed or not serving, 2 usage, 3 no daemon, 4 daemon error."""


def cli_hint(error: AccyError) -> str:
    """What to do about ``error`` in this command's flags ("" where there is nothing to add)."""
    if isinstance(error, CertificateNotVerified):
        return "; check --tls-ca (and --tls-server-name)"
    if isinstance(error, DaemonUnreachable):
        hint = "; pass its address with --target (or set ACCY_TARGET)"
        if "if it serves TLS" in error.message:  # a plaintext channel to a TCP address
            hint += "; if it serves TLS, pass --tls-ca (or --tls for the system's roots)"
        return hint
    if isinstance(error, Unauthenticated):
        return "; pass --token or set ACCY_TOKEN"
    if isinstance(error, PermissionDenied):
        return "; pass a --token (or ACCY_TOKEN) whose scopes allow this call"
    return ""


class UsageError(Exception):
    """Arguments that do not fit the pipeline: exit code 2 with one line."""


# -- progress --------------------------------------------------------------------------


def _progress(label: str, total: int, stream: TextIO) -> Progress | None:
    """A chunk-progress printer for large transfers on a terminal; ``None`` otherwise."""
    if total < (32 << 20) or not stream.isatty():
        return None
    last = [0.0]

    def report(done: int, of: int) -> None:
        now = time.monotonic()
        if done < of and now - last[0] < 0.1:
            return
        last[0] = now
        end = "\n" if done >= of else ""
        stream.write(f"\r{label}: {done / of:4.0%} of {_table.bytes_text(of)}{end}")
        stream.flush()

    return report


# -- run -------------------------------------------------------------------------------


def _parse_scalar(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name.strip(), value.strip()


def _typed_scalars(
    info: PipelineInfo, given: Sequence[tuple[str, str]], rng: np.random.Generator
) -> tuple[dict[str, float], list[str]]:
    """Typed runtime scalars: given ones parsed by dtype, missing floats drawn at random."""
    values: dict[str, float] = {}
    for name, text in given:
        try:
            spec = info.scalar(name)
        except KeyError as error:
            raise UsageError(str(error.args[0])) from None
        try:
            values[name] = int(text, 0) if spec.is_integer else float(text)
        except ValueError:
            raise UsageError(f"scalar {name}={text!r} is not a {spec.dtype}") from None
    drawn = []
    missing = []
    for spec in info.runtime_scalars:
        if spec.name in values:
            continue
        if spec.is_integer:
            missing.append(spec.name)
        else:
            values[spec.name] = float(spec.dtype.type(rng.random()))
            drawn.append(spec.name)
    if missing:
        flags = " ".join(f"--scalar {m}=VALUE" for m in missing)
        raise UsageError(f"{info.target} needs integer scalars: {flags}")
    return values, drawn


def _random_input(
    rng: np.random.Generator, count: int, dtype: np.dtype[Any]
) -> np.ndarray[Any, Any]:
    if dtype.kind == "f":
        return rng.random(count, dtype=np.float64).astype(dtype)
    return rng.integers(0, 100, size=count, dtype=dtype)


def _shape(spec: BufferSpec, integers: Mapping[str, int]) -> tuple[int, np.dtype[Any]]:
    """Elements and dtype of one operand or result for these scalars."""
    try:
        count = spec.elements(integers)
    except ExtentError as error:
        raise UsageError(str(error)) from None
    return count, spec.dtype or np.dtype(np.float32)


@dataclass
class _RunReport:
    target: str
    version: int
    format: str
    backend: str
    device_name: str
    scalars: dict[str, float]
    drawn_scalars: list[str]
    seed: int
    repeat: int
    bytes_up: int = 0
    bytes_down: int = 0
    load_seconds: float = 0.0
    upload_seconds: float = 0.0
    launch_seconds: list[float] = field(default_factory=list)
    daemon_seconds: list[float] = field(default_factory=list)
    download_seconds: float = 0.0
    check: list[dict[str, Any]] | None = None
    check_note: str | None = None

    @property
    def ok(self) -> bool:
        return self.check is None or all(c["ok"] for c in self.check)

    def to_dict(self) -> dict[str, Any]:
        launches = self.launch_seconds
        return {
            "target": self.target,
            "version": self.version,
            "format": self.format,
            "backend": self.backend,
            "device_name": self.device_name,
            "scalars": self.scalars,
            "seed": self.seed,
            "repeat": self.repeat,
            "bytes_uploaded": self.bytes_up,
            "bytes_downloaded": self.bytes_down,
            "load_seconds": self.load_seconds,
            "upload_seconds": self.upload_seconds,
            "launch_p50_seconds": statistics.median(launches),
            "launch_min_seconds": min(launches),
            "launch_seconds": launches,
            "daemon_launch_p50_seconds": statistics.median(self.daemon_seconds),
            "download_seconds": self.download_seconds,
            "check": self.check,
            "check_note": self.check_note,
            "ok": self.ok,
        }

    def to_text(self) -> str:
        scalars = ", ".join(
            f"{k}={v if isinstance(v, int) else f'{v:g}'}"
            f"{' (random)' if k in self.drawn_scalars else ''}"
            for k, v in self.scalars.items()
        )
        t = _table.seconds_text
        launches = self.launch_seconds
        rows = [
            ["load", t(self.load_seconds), ""],
            [
                "upload",
                t(self.upload_seconds),
                f"{_table.bytes_text(self.bytes_up)}, "
                f"{_table.rate_text(self.bytes_up, self.upload_seconds)}",
            ],
            [
                "launch p50",
                t(statistics.median(launches)),
                f"min {t(min(launches))} over {len(launches)}; "
                f"daemon p50 {t(statistics.median(self.daemon_seconds))}",
            ],
            [
                "download",
                t(self.download_seconds),
                f"{_table.bytes_text(self.bytes_down)}, "
                f"{_table.rate_text(self.bytes_down, self.download_seconds)}",
            ],
        ]
        for c in self.check or []:
            verdict = "ok" if c["ok"] else "MISMATCH"
            rows.append(
                [
                    f"check {c['result']}",
                    verdict,
                    f"relative L2 error {c['error']:.3g} (tolerance {c['tolerance']:.3g})",
                ]
            )
        if self.check_note:
            rows.append(["check", "skipped", self.check_note])
        head = (
            f"{self.target} v{self.version} ({self.format}) on {self.backend}"
            f" [{self.device_name}]: {scalars}; seed {self.seed}"
        )
        return head + "\n" + _table.plain(["phase", "time", "detail"], rows)


def _run(client: Client, args: argparse.Namespace) -> int:
    info = client.pipeline(args.pipeline, args.version)
    rng = np.random.default_rng(args.seed)
    given = list(args.scalar)
    if args.n is not None:
        given.insert(0, ("n", str(args.n)))
    scalars, drawn = _typed_scalars(info, given, rng)
    integers = {k: int(v) for k, v in scalars.items() if info.scalar(k).is_integer}
    inputs = [_random_input(rng, *_shape(spec, integers)) for spec in info.operands]
    err = sys.stderr
    started = time.perf_counter()
    session = client.load(args.pipeline, args.version, args.format)
    report = _RunReport(
        target=info.target,
        version=session.info.version,
        format=session.format,
        backend=client.attachment.backend,
        device_name=client.attachment.device_name,
        scalars=scalars,
        drawn_scalars=drawn,
        seed=args.seed,
        repeat=args.repeat,
    )
    buffers: list[Buffer] = []
    try:
        session.allocate_intermediates(**scalars)
        report.load_seconds = time.perf_counter() - started

        started = time.perf_counter()
        for spec, array in zip(info.operands, inputs, strict=True):
            progress = _progress(f"upload {spec.name}", array.nbytes, err)
            buffers.append(client.buffer(array, progress=progress))
        report.upload_seconds = time.perf_counter() - started
        report.bytes_up = sum(a.nbytes for a in inputs)

        outputs = [client.empty(*_shape(spec, integers)) for spec in info.results]
        buffers.extend(outputs)
        show = err.isatty() and args.repeat >= 20
        for k in range(args.repeat):
            started = time.perf_counter()
            launch = session.launch(buffers[: len(inputs)], outputs, wait=True, **scalars)
            report.launch_seconds.append(time.perf_counter() - started)
            report.daemon_seconds.append(launch.elapsed_seconds)
            if show and (k + 1) % max(1, args.repeat // 20) == 0:
                err.write(f"\rlaunch {k + 1}/{args.repeat}")
                err.flush()
        if show:
            err.write("\n")

        started = time.perf_counter()
        results = []
        for spec, out in zip(info.results, outputs, strict=True):
            results.append(out.read(progress=_progress(f"download {spec.name}", out.nbytes, err)))
        report.download_seconds = time.perf_counter() - started
        report.bytes_down = sum(r.nbytes for r in results)
    finally:
        for buffer in buffers:
            buffer.free()
        session.release()

    if args.check:
        reference = references.find(info.target)
        if reference is None:
            report.check_note = f"no reference is known for {info.target}"
        else:
            report.check = [
                {
                    "result": info.results[c.index].name,
                    "error": c.error,
                    "tolerance": c.tolerance,
                    "ok": c.ok,
                }
                for c in references.compare(reference, inputs, results, scalars)
            ]
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.to_text())
    if report.check_note:
        print(f"accy: {report.check_note}", file=err)
    return 0 if report.ok else EXIT_CHECK_FAILED


# -- pipelines, status, health -----------------------------------------------------------


def _pipelines(client: Client, args: argparse.Namespace) -> int:
    infos = client.pipelines()
    if args.json:
        print(json.dumps([p.to_dict() for p in infos], indent=2))
        return 0
    rows = [
        [p.target, str(p.version), str(p.stage_count), ",".join(p.formats), p.signature()]
        for p in infos
    ]
    print(_table.plain(["pipeline", "version", "stages", "formats", "signature"], rows))
    return 0


def _status(client: Client, args: argparse.Namespace) -> int:
    status = client.status()
    fields = {"target": client.target, **status.to_dict()}
    fields.setdefault("tenant", client.attachment.tenant)
    print(json.dumps(fields, indent=2) if args.json else status_text(fields))
    return 0 if status.serving else EXIT_CHECK_FAILED


def _value_text(name: str, value: Any) -> str:
    """One status value for people: sizes also in binary units, unset as ``-``."""
    if value is None:
        return "-"
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
            print(f"accy: health check failed: {error}", file=sys.stderr)
            return EXIT_DAEMON_ERROR
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
        "--timeout", type=float, default=120.0, help="seconds each call may take (default 120)"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = commands.add_parser("pipelines", help="list the daemon's pipelines")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = commands.add_parser("status", help="show the daemon's state")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = commands.add_parser(
        "run", help="run a pipeline on random inputs and time it", epilog=_EPILOG
    )
    p.add_argument("pipeline", help="pipeline target, e.g. accy.kernel.device_scan")
    p.add_argument("--n", type=int, help="the runtime scalar n (elements)")
    p.add_argument(
        "--scalar",
        action="append",
        type=_parse_scalar,
        default=[],
        metavar="NAME=VALUE",
        help="a runtime scalar (repeatable); float scalars not given are drawn at random",
    )
    p.add_argument("--version", type=int, default=0, help="pipeline version (default newest)")
    p.add_argument("--format", default="", help="artifact format (default: the backend's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--repeat", type=int, default=1, help="launches to time (default 1)")
    p.add_argument("--check", action="store_true", help="compare with the numpy reference")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = commands.add_parser("health", help="ask the gRPC health service (for containers)")
    p.add_argument("--service", default="", help="service name (default: the whole server)")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds to wait (default 3)")
    return parser


_COMMANDS: dict[str, Callable[[Client, argparse.Namespace], int]] = {
    "pipelines": _pipelines,
    "status": _status,
    "run": _run,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "run" and args.repeat < 1:
        parser.error("--repeat must be at least 1")
    try:
        credentials = channel_credentials(
            tls=args.tls, tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key
        )
    except ValueError as error:
        parser.error(str(error))
    try:
        target = resolve_target(args.target)
        if args.command == "health":
            return _health(target, credentials, args)
        with Client(
            target,
            token=args.token,
            timeout=args.timeout,
            credentials=credentials,
            tls_server_name=args.tls_server_name,
        ) as client:
            return _COMMANDS[args.command](client, args)
    except DaemonUnreachable as error:
        print(f"accy: {error.message}{cli_hint(error)}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except UnsafeSocketFolder as error:
        print(f"accy: {error}; or pass --target", file=sys.stderr)
        return EXIT_UNREACHABLE
    except UsageError as error:
        print(f"accy: {error}", file=sys.stderr)
        return EXIT_USAGE
    except AccyError as error:
        print(f"accy: {error}{cli_hint(error)}", file=sys.stderr)
        return EXIT_DAEMON_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
