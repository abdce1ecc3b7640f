"""The KServe v2 HTTP/REST door's server: aiohttp on the daemon's own event loop.

It listens where ``--kserve-http-listen`` says (``host:port``, or ``unix:/path``),
with the daemon's TLS on TCP when a certificate is configured (mutual TLS
with ``--tls-client-ca``), and bounds every request body by the daemon's
largest message. Every answer that is no success is JSON, ``{"error": ...}``
(``refusals.py``), an unknown route and a body past the bound included.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog
from aiohttp import web

from accyd.doors.grpc.admission import Admission
from accyd.doors.kserve.servicer import KServeServicer
from accyd.doors.kserve_http.refusals import error_response, refusal_of
from accyd.doors.kserve_http.routes import Routes
from accyd.errors import Unavailable
from accyd.process.socket_claim import SocketClaim, umask
from accyd.settings.config import Config

__all__ = ["KServeHttpDoor", "serve_http", "tls_context"]

log = structlog.get_logger("accyd.doors.kserve_http")

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def tls_context(config: Config) -> ssl.SSLContext | None:
    """The TCP listeners' TLS, from the files the gRPC listeners use (checked at start by
    ``accyd.doors.grpc.tls``); ``None`` without a certificate."""
    if config.tls_cert is None or config.tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(config.tls_cert.expanduser(), config.tls_key.expanduser())
    if config.tls_client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(config.tls_client_ca.expanduser())
    return context


@web.middleware
async def _json_errors(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """Every refusal as ``{"error": ...}`` with its HTTP status."""
    try:
        return await handler(request)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        if error.status == 404:
            message = f"no route {request.method} {request.path}: docs/kserve.md lists them"
        elif error.status == 405:
            message = f"{request.method} is not served at {request.path}"
        else:
            message = error.text or error.reason
        return web.Response(
            status=error.status,
            body=json.dumps({"error": message}).encode(),
            content_type="application/json",
        )
    except Exception as error:
        return error_response(refusal_of(error))


class KServeHttpDoor:
    """The door over one ``KServeServicer``: ``start`` its listeners, ``close`` at stop."""

    def __init__(
        self,
        servicer: KServeServicer,
        admission: Admission,
        *,
        max_body_bytes: int,
        shutdown_seconds: float = 10.0,
    ) -> None:
        self.max_body_bytes = max_body_bytes
        self.app = web.Application(client_max_size=max_body_bytes, middlewares=[_json_errors])
        Routes(servicer, admission, max_body_bytes=max_body_bytes).add_to(self.app)
        self._runner = web.AppRunner(
            self.app, access_log=None, handle_signals=False, shutdown_timeout=shutdown_seconds
        )
        self.addresses: list[str] = []
        self._claims: list[SocketClaim] = []

    async def start(self, addresses: tuple[str, ...], tls: ssl.SSLContext | None) -> list[str]:
        """Listen at each address; returns where (a port 0 resolved)."""
        await self._runner.setup()
        try:
            for address in addresses:
                self.addresses.append(await self._listen(address, tls))
        except BaseException:
            await self.close()
            raise
        return self.addresses

    async def _listen(self, address: str, tls: ssl.SSLContext | None) -> str:
        before = set(map(str, self._runner.addresses))
        site: web.BaseSite
        if address.startswith("unix:"):
            path = Path(address.removeprefix("unix:")).expanduser()
            claim = SocketClaim(path)  # one daemon per path; only a stale socket replaced
            claim.take()
            self._claims.append(claim)
            site = web.UnixSite(self._runner, str(path))
            with umask(0o117):
                await self._start(site, address)
            claim.bound()
            return f"unix:{path}"
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise Unavailable(f"cannot listen on {address}: give host:port or unix:/path")
        site = web.TCPSite(self._runner, host.strip("[]"), int(port), ssl_context=tls)
        await self._start(site, address)
        bound = [a for a in self._runner.addresses if str(a) not in before]
        actual = bound[0][1] if bound and isinstance(bound[0], tuple) else int(port)
        return f"{host}:{actual}"

    @staticmethod
    async def _start(site: web.BaseSite, address: str) -> None:
        try:
            await site.start()
        except OSError as error:
            raise Unavailable(f"cannot listen on {address} for KServe HTTP: {error}") from None

    async def close(self) -> None:
        """Stop listening, let the requests in flight end (up to the shutdown time), close."""
        await self._runner.cleanup()
        for claim in self._claims:
            claim.release()
        log.info("kserve http door closed")


async def serve_http(
    servicer: KServeServicer, admission: Admission, config: Config
) -> KServeHttpDoor:
    """The door as ``accyd serve`` runs it, listening where its flags say."""
    door = KServeHttpDoor(
        servicer,
        admission,
        max_body_bytes=config.max_message_bytes,
        shutdown_seconds=config.grace_seconds,
    )
    await door.start(config.kserve_http_listen, tls_context(config))
    return door
