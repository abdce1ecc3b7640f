"""An HTTP request seen as a gRPC call's context, so that the gRPC door's handlers serve it.

The KServe gRPC door's handlers read three things of their context: the
caller's metadata (the bearer token, through the daemon's admission), its peer
(who the caller is, ``accyd.doors.kserve.peers``), and ``abort`` (a refusal).
Here the metadata are the request's headers, named in lower case as gRPC's
are; the peer is written as gRPC writes it (``ipv4:127.0.0.1:5123``,
``ipv6:[::1]:5123``, ``unix:``), so an HTTP caller on the loopback is the same
KServe client as its gRPC calls from the same user and tenant; and an abort
raises ``Refused``. aiohttp runs each request in a task of its own (a copy of the
connection's context), so what the admission sets for a call (its principal, its log
fields) ends with the request, as it ends with a gRPC call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

import grpc
from aiohttp import web

from accyd.doors.kserve_http.refusals import Refused

__all__ = ["HttpContext", "peer_text"]


def peer_text(request: web.Request) -> str:
    """The request's peer as gRPC writes a call's."""
    transport = request.transport
    name = None if transport is None else transport.get_extra_info("peername")
    if isinstance(name, tuple) and len(name) >= 2:
        host, port = str(name[0]), int(name[1])
        if ":" in host:
            return f"ipv6:[{host}]:{port}"
        return f"ipv4:{host}:{port}"
    if transport is not None and transport.get_extra_info("sockname") is not None:
        return "unix:"  # a Unix socket's peer has no name
    return "unknown:"


class HttpContext:
    """What of ``grpc.aio.ServicerContext`` the KServe handlers use, for one HTTP request."""

    __slots__ = ("_done", "_metadata", "_peer")

    def __init__(self, request: web.Request) -> None:
        self._metadata = tuple((key.lower(), value) for key, value in request.headers.items())
        self._peer = peer_text(request)
        self._done: list[Callable[[HttpContext], None]] = []

    def add_done_callback(self, callback: Callable[[HttpContext], None]) -> None:
        """Called with this context once the route's answer is made (``done``)."""
        self._done.append(callback)

    def done(self) -> None:
        """The route's answer is made (aiohttp sends it): run the done callbacks, once."""
        callbacks, self._done = self._done, []
        for callback in callbacks:
            callback(self)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def peer(self) -> str:
        return self._peer

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()
    ) -> NoReturn:
        raise Refused(code, details)
