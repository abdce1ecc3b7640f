"""For tests of programs that use accy: a real daemon to run, and a client's wire to fake or see.

``running_daemon`` runs a real ``accyd serve`` in a subprocess and stops it after:
the daemon is started as a program, the way users start it; nothing of the
daemon's package is imported here. It can be killed and started again on the
same addresses, to test what clients do when their daemon restarts.

``FakeTransport`` takes a client's launches, waits and buffer bytes in this process
(``Client(transport=FakeTransport())``); its ``requests`` are the request values the
client handed it. ``transport_of`` is a client's transport now (its ``path``: which way
launches go), and ``call`` makes one raw call as a client (what the client itself never
sends: another client's ids, hostile fields), for tests of what the daemon refuses.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from accy._connection import UNSET
from accy._fake_transport import FakeTransport
from accy._seam import (
    CopyRequest,
    LaunchRequest,
    ReadRequest,
    Transport,
    WaitRequest,
    WriteRequest,
)
from accy.client import Client

__all__ = [
    "Certificates",
    "CopyRequest",
    "FakeTransport",
    "LaunchRequest",
    "ReadRequest",
    "RunningDaemon",
    "Transport",
    "WaitRequest",
    "WriteRequest",
    "call",
    "free_port",
    "running_daemon",
    "serving",
    "transport_of",
    "write_certificates",
]

_MAIN = "import sys; from accyd.cli import main; sys.exit(main())"


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def transport_of(client: Client) -> Transport:
    """The transport of ``client``'s latest attachment. Its ``path`` says which way launches
    go: ``ring``, ``ring-stream``, ``unary``, or ``pending`` before the first launch."""
    link = client._conn.last
    if link is None:
        raise RuntimeError("the client never attached")
    return link.transport


def call(client: Client, method: str, request: Any, timeout: float | None = UNSET) -> Any:
    """One unary call of ``accy.launch.v1.LaunchService`` (``method``: ``"ExportBuffer"``...)
    as ``client``, with its credentials and client id; the answer, or the typed error."""
    conn = client._conn
    return conn.unary(getattr(conn.stub, method), request, timeout)


def serving(target: str, timeout: float = 1.0) -> bool:
    """Whether the gRPC health service at ``target`` (plaintext) answers SERVING."""
    with grpc.insecure_channel(target) as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            health_pb2.HealthCheckRequest.SerializeToString,
            health_pb2.HealthCheckResponse.FromString,
        )
        try:
            reply = check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


@dataclass
class RunningDaemon:
    """A daemon process (in a process group of its own) and the addresses it serves."""

    command: list[str]
    env: dict[str, str]
    unix_target: str
    tcp_target: str | None
    log: Path
    ready_timeout: float = 60.0
    process: subprocess.Popen[bytes] = field(init=False)
    starts: int = field(default=0, init=False)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def start(self) -> None:
        """Start the daemon (again, on the same addresses) and wait until it serves."""
        with self.log.open("ab") as sink:
            self.process = subprocess.Popen(
                self.command,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # a supervisor and its server die together in kill()
            )
        self.starts += 1
        self.wait_serving()

    def wait_serving(self, timeout: float | None = None) -> None:
        """Block until the health service answers SERVING; raise with the log if it cannot."""
        limit = self.ready_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while not serving(self.unix_target):
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"accyd exited with {self.process.returncode}:\n{self.log_text()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"accyd did not serve within {limit} s:\n{self.log_text()}")
            time.sleep(0.05)

    def kill(self, signum: int = signal.SIGKILL) -> int:
        """Send ``signum`` to the daemon's whole process group and reap it; returns its code."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signum)
        return self.process.wait(timeout=30)

    def restart(self) -> None:
        """Kill the daemon outright (no drain: as a crash would) and start a new one."""
        self.kill()
        self.start()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not stopped within 15 s."""
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.kill()


@contextlib.contextmanager
def running_daemon(
    *,
    backend: str = "host",
    tcp: bool = True,
    ready_timeout: float = 60.0,
    extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    insecure: bool = True,
) -> Iterator[RunningDaemon]:
    """``accyd serve`` on a fresh Unix socket (and TCP loopback), ready to serve; stopped after.

    ``extra`` adds flags (``--catalog DIR``, ``--tokens FILE``...), ``env``
    variables; ``insecure`` allows TCP without credentials.
    """
    folder = Path(tempfile.mkdtemp(prefix="accy-e2e-"))
    unix_target = f"unix:{folder}/s.sock"
    tcp_target = f"127.0.0.1:{free_port()}" if tcp else None
    command = [sys.executable, "-c", _MAIN, "serve", "--backend", backend, "--listen", unix_target]
    if tcp_target:
        command += ["--listen", tcp_target]
    command += list(extra)
    variables = dict(os.environ, ACCYD_CACHE_DIR=str(folder / "cache"))
    if insecure:
        variables["ACCYD_INSECURE"] = "true"
    variables.update(env or {})
    daemon = RunningDaemon(
        command, variables, unix_target, tcp_target, folder / "accyd.log", ready_timeout
    )
    try:
        daemon.start()
        yield daemon
    finally:
        with contextlib.suppress(AttributeError):  # it never started
            daemon.stop()
        shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True)
class Certificates:
    """PEM files of a throwaway CA, a server certificate it signed, and a client one."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def write_certificates(
    folder: Path, hosts: Sequence[str] = ("localhost", "127.0.0.1"), *, server_days: float = 1.0
) -> Certificates:
    """A CA, a server certificate for ``hosts`` and a client certificate, written to ``folder``.

    The server certificate ends ``server_days`` from now (a negative number: it expired
    that long ago). For TLS and mutual TLS tests only (needs the ``cryptography`` package).
    """
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    folder.mkdir(parents=True, exist_ok=True)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def save(stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Path:
        (folder / f"{stem}.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        path = folder / f"{stem}.pem"
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return path

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("accy test CA"))
        .issuer_name(name("accy test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )

    def issue(
        common: str, usage: x509.ObjectIdentifier, sans: Sequence[str], days: float = 1.0
    ) -> Path:
        end = now + datetime.timedelta(days=days)
        key = ec.generate_private_key(ec.SECP256R1())
        alt: list[x509.GeneralName] = []
        for host in sans:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                alt.append(x509.DNSName(host))
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(common))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(min(now, end) - datetime.timedelta(minutes=5))
            .not_valid_after(end)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if alt:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        return save(common, builder.sign(ca_key, hashes.SHA256()), key)

    server = issue("server", ExtendedKeyUsageOID.SERVER_AUTH, hosts, server_days)
    client = issue("client", ExtendedKeyUsageOID.CLIENT_AUTH, ())
    return Certificates(
        ca=save("ca", ca, ca_key),
        server_cert=server,
        server_key=server.with_suffix(".key"),
        client_cert=client,
        client_key=client.with_suffix(".key"),
    )
