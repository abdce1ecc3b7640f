"""Per-call plumbing: request ids, log context, errors to status, calls in flight.

A call's blocking work (compiles, allocations, copies) runs on the device-work
threads (``accyd.scheduling.DeviceWork``, reached through ``CallTracker.work``),
within its client's share; waits for the device never run there (the core awaits
them on the event loop).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import grpc
import structlog

from accy.protocol import CLIENT_ID_METADATA as CLIENT_ID_HEADER
from accyd.core.ids import new_request_id
from accyd.doors.grpc.status import refusal_fields, to_status
from accyd.errors import AccyError, InvalidRequest
from accyd.logs import LazyToken, bind_lazily, debug_enabled, unbind_lazily
from accyd.scheduling import DeviceWork

__all__ = [
    "CLIENT_ID_HEADER",
    "MAX_ID_LENGTH",
    "Call",
    "CallTracker",
    "Context",
    "id_fields",
    "log_failure",
    "remember_metadata",
    "streaming",
    "text_field",
    "unary",
]

MAX_ID_LENGTH = 256
LONG_LIVED = frozenset({"Attach", "RingStream", "ModelStreamInfer"})
"""Calls that last as long as their client: not counted as in flight (a stream's launches and
requests are); the drain ends them (detaching their clients, ending the KServe streams)."""

Context = grpc.aio.ServicerContext[Any, Any]
_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")

log = structlog.get_logger("accyd.doors.grpc")


@dataclass(slots=True)
class Call:
    """What one call knows about itself: its request id, its client, its context, its peer."""

    method: str
    request_id: str
    client_id: str | None
    context: Context
    started: float = field(default_factory=time.perf_counter)
    peer: str = ""
    """gRPC's text for the caller (``unix:...``, ``ipv4:...``), read as the call began: never
    ask the context later. gRPC's core keeps the peer in the connection's transport, and a
    call outliving its connection (a stream's request answered after the caller went) read
    freed memory there: the daemon died of SIGSEGV under tests/survival/test_cross_tenant.py."""

    def need_client(self) -> str:
        if not self.client_id:
            raise InvalidRequest(
                f"call Attach first and send its client id in the {CLIENT_ID_HEADER!r} metadata",
                field=CLIENT_ID_HEADER,
            )
        return self.client_id

    def log_fields(self, event: structlog.typing.EventDict) -> None:
        """The call's ids on each line logged while it runs (bound lazily:
        ``accyd.logs``)."""
        event.setdefault("request_id", self.request_id)
        event.setdefault("rpc", self.method)
        event.setdefault("client_id", self.client_id)


class CallTracker:
    """Counts calls in flight (long-lived streams aside), for the drain, and holds the
    device-work threads their blocking work runs on (``work``: ``accyd.scheduling``)."""

    def __init__(self, work: DeviceWork) -> None:
        self.work = work
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self, method: str) -> None:
        if method not in LONG_LIVED:
            self._active += 1
            self._idle.clear()

    def leave(self, method: str) -> None:
        if method not in LONG_LIVED:
            self._active -= 1
            if self._active == 0:
                self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), max(timeout, 0.0))
        except TimeoutError:
            return False
        return True


def text_field(value: str, field: str, *, required: bool = True) -> str:
    """An id or name field of a request: present (if required) and of sane length."""
    if required and not value:
        raise InvalidRequest(f"{field} is empty", field=field)
    if len(value) > MAX_ID_LENGTH:
        raise InvalidRequest(f"{field} is longer than {MAX_ID_LENGTH} characters", field=field)
    return value


def id_fields(values: Iterable[str], field: str) -> list[str]:
    """A repeated id field: each one present and of sane length."""
    return [text_field(value, f"{field}[{index}]") for index, value in enumerate(values)]


class _Servicer(Protocol):
    @property
    def calls(self) -> CallTracker: ...


_S = TypeVar("_S", bound=_Servicer)


_Metadata = Sequence[tuple[str, Any]]
_metadata: contextvars.ContextVar[tuple[Context, _Metadata] | None] = contextvars.ContextVar(
    "accyd_call_metadata", default=None
)


def remember_metadata(context: Context, metadata: _Metadata) -> None:
    """Keep the call's metadata, read once (by the auth check) for its handler: grpc builds
    it anew at each ``invocation_metadata()`` (several µs). Each call runs in a task of its
    own, so what is kept here ends with the call."""
    _metadata.set((context, metadata))


def _client_id(context: Context) -> str | None:
    remembered = _metadata.get()
    metadata: _Metadata = (
        remembered[1]
        if remembered is not None and remembered[0] is context
        else tuple(context.invocation_metadata() or ())
    )
    for key, value in metadata:
        if key == CLIENT_ID_HEADER and isinstance(value, str):
            if len(value) > MAX_ID_LENGTH:
                raise InvalidRequest("the client id is too long", field=CLIENT_ID_HEADER)
            return value
    return None


def _begin(servicer: _Servicer, method: str, context: Context) -> tuple[Call, LazyToken]:
    call = Call(method, new_request_id(), None, context, peer=context.peer() or "")
    token = bind_lazily(call)
    servicer.calls.enter(method)
    return call, token


def log_failure(what: str, error: Exception, **context: object) -> None:
    """Log ``what`` (a call, a launch) failing: a refusal as such, anything else with its trace."""
    if isinstance(error, AccyError):
        log.info(f"{what} refused", **context, **refusal_fields(error))
    else:
        log.exception(f"{what} failed", **context)


async def _fail(call: Call, error: Exception) -> None:
    log_failure("call", error)
    status = to_status(error, call.request_id)
    await call.context.abort(status.code, status.details, status.trailing_metadata)


def _end(servicer: _Servicer, call: Call, token: LazyToken) -> None:
    servicer.calls.leave(call.method)
    if debug_enabled():  # the line's fields cost a call a few µs, logged or not
        log.debug("call done", seconds=round(time.perf_counter() - call.started, 6))
    unbind_lazily(token)


def unary(
    method: Callable[[_S, _Req, Call], Awaitable[_Resp]],
) -> Callable[[_S, _Req, Context], Awaitable[_Resp]]:
    """Wrap a unary (or client-streaming) handler: ids, logs, errors to status."""
    name = method.__name__

    @functools.wraps(method)
    async def handler(self: _S, request: _Req, context: Context) -> _Resp:
        call, token = _begin(self, name, context)
        try:
            call.client_id = _client_id(context)
            return await method(self, request, call)
        except grpc.aio.AbortError:
            raise
        except Exception as error:
            await _fail(call, error)
            raise
        finally:
            _end(self, call, token)

    return handler


def streaming(
    method: Callable[[_S, _Req, Call], AsyncIterator[_Resp]],
) -> Callable[[_S, _Req, Context], AsyncIterator[_Resp]]:
    """Wrap a server-streaming handler: ids, logs, errors to status."""
    name = method.__name__

    @functools.wraps(method)
    async def handler(self: _S, request: _Req, context: Context) -> AsyncIterator[_Resp]:
        call, token = _begin(self, name, context)
        try:
            call.client_id = _client_id(context)
            async for item in method(self, request, call):
                yield item
        except grpc.aio.AbortError:
            raise
        except Exception as error:
            await _fail(call, error)
        finally:
            _end(self, call, token)

    return handler
