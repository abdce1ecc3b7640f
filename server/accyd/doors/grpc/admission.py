"""Admission: each call's caller checked (``auth``) and counted in flight before its handler runs.

``Admission`` is the one core every door's calls pass. ``admitted(service, name, behavior)``
is ``behavior`` (a handler taking a request and a context) that first checks its caller,
inside the task that runs the call, refuses it with the refusal's status
(``UNAUTHENTICATED``, ``PERMISSION_DENIED``, ``NOT_FOUND``) and a request id, or sets its
principal (``current_principal``) and log fields and runs it in ``in_flight``.

``AdmissionInterceptor`` is the gRPC server's interceptor: every method of every service
but the open ones (health, reflection) is served by its handler with its behavior
``admitted``, wrapped once, at the method's first call (grpc asks the interceptor on every
call; a method seen before costs a dict lookup). The KServe HTTP door calls ``admitted``
for each of its routes itself, as the RPC the route is.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
from collections.abc import Awaitable, Callable, Collection
from typing import Any, TypeVar, cast

import grpc

from accyd.core.ids import new_request_id
from accyd.doors.grpc.auth import OPEN_SERVICES, Authenticator, scopes_of
from accyd.doors.grpc.calls import Context, log_failure, remember_metadata
from accyd.doors.grpc.in_flight import Admitted, InFlight
from accyd.doors.grpc.status import to_status
from accyd.errors import AccyError, PermissionDenied, Unauthenticated
from accyd.logs import Fields, bind_lazily
from accyd.tokens import Principal

__all__ = ["UNDRAINED", "Admission", "AdmissionInterceptor", "current_principal"]

UNDRAINED = frozenset({"Attach"})
"""Calls a stop ends by itself (``close_attach_streams``), not through ``InFlight.end_all``."""

_principal: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "accy_principal", default=None
)

_Behavior = Callable[..., Any]
_Admit = Callable[[Context], Awaitable[None]]
_Enter = Callable[..., asyncio.Task[Any]]
"""``InFlight.enter`` with the method's scopes and drain given: (context, principal)."""
_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")
_Handler = grpc.RpcMethodHandler


def current_principal() -> Principal | None:
    """Who the call in progress comes from; ``None`` outside an admitted call."""
    return _principal.get()


class Admission:
    """Checks each call's credentials and scopes before its handler runs; every call it
    admits is in ``in_flight`` while it runs, and ``revoke`` ends those that new tokens no
    longer admit."""

    def __init__(self, authenticator: Authenticator) -> None:
        self.authenticator = authenticator
        self.in_flight = InFlight()
        self._tenants: dict[str, Fields] = {}

    def admitted(self, service: str, name: str, behavior: _Behavior) -> _Behavior:
        """``behavior`` (a handler taking request and context) admitted as ``service``'s
        method ``name``, and counted in ``in_flight`` while it runs."""
        method = f"/{service}/{name}"
        admit = functools.partial(self._admit, method, scopes_of(method))
        enter = functools.partial(
            self.in_flight.enter, scopes=scopes_of(name), drained=name not in UNDRAINED
        )
        return _admitted(behavior, admit, enter, self.in_flight)

    def revoke(self) -> int:
        """After the tokens were replaced: end each call in flight (streams included) that
        they no longer admit as they did, saying why; how many."""
        return self.in_flight.end_where(self._refusal)

    def _refusal(self, call: Admitted) -> AccyError | None:
        """Why the tokens now in force no longer admit ``call`` (in flight) as they did."""
        context = call.context
        try:
            metadata = tuple(context.invocation_metadata() or ())
            now = self.authenticator.check(metadata, context.peer, *call.scopes)
        except AccyError as error:
            kind = Unauthenticated if isinstance(error, Unauthenticated) else PermissionDenied
            why = f"the daemon's tokens were reloaded and do not admit this call: {error.message}"
            return kind(why)
        if call.principal is not None and now.tenant != call.principal.tenant:
            return PermissionDenied(
                f"the daemon's tokens were reloaded: this call's token is tenant {now.tenant!r}'s "
                f"now, not {call.principal.tenant!r}'s"
            )
        return None

    async def _admit(self, method: str, scopes: tuple[str, ...], context: Context) -> None:
        metadata = tuple(context.invocation_metadata() or ())
        try:
            principal = self.authenticator.check(metadata, context.peer, *scopes)
        except AccyError as error:
            request_id = new_request_id()
            log_failure("call", error, rpc=method, request_id=request_id)
            status = to_status(error, request_id)
            await context.abort(status.code, status.details, status.trailing_metadata)
        # Each call runs in a task of its own: what is set here ends with the call.
        _principal.set(principal)
        remember_metadata(context, metadata)
        tenant = self._tenants.get(principal.tenant)
        if tenant is None:  # one per tenant the tokens name: a handful
            tenant = self._tenants[principal.tenant] = Fields({"tenant": principal.tenant})
        bind_lazily(tenant)


class AdmissionInterceptor(grpc.aio.ServerInterceptor):
    """The server's interceptor: every call of a service not in ``open_services`` admitted
    by ``admission`` before its handler runs; the open services' calls as they come."""

    def __init__(
        self, admission: Admission, open_services: Collection[str] = OPEN_SERVICES
    ) -> None:
        self._admission = admission
        self._open = frozenset(open_services)
        self._handlers: dict[str, _Handler[Any, Any]] = {}
        """Each method's handler as served, by ``/package.Service/Name``, once called (the
        services are registered before the server starts and never change after)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[_Handler[_Req, _Resp] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> _Handler[_Req, _Resp] | None:
        method = handler_call_details.method
        served = self._handlers.get(method)
        if served is None:
            handler = await continuation(handler_call_details)
            if handler is None:  # no such method: UNIMPLEMENTED, no token asked for
                return None
            served = self._handlers[method] = self._serve(method, handler)
        return cast("_Handler[_Req, _Resp]", served)

    def _serve(self, method: str, handler: _Handler[_Req, _Resp]) -> _Handler[_Req, _Resp]:
        """``handler`` as the server serves it: admitted unless its service is open."""
        service, _, name = method.removeprefix("/").rpartition("/")
        if service in self._open:
            return handler
        return _wrap(handler, functools.partial(self._admission.admitted, service, name))


def _wrap(
    handler: _Handler[_Req, _Resp], admitted: Callable[[_Behavior], _Behavior]
) -> _Handler[_Req, _Resp]:
    """The same handler (its kind, its serializers), with its behavior ``admitted``."""
    kinds = (
        ("unary_unary", grpc.unary_unary_rpc_method_handler),
        ("unary_stream", grpc.unary_stream_rpc_method_handler),
        ("stream_unary", grpc.stream_unary_rpc_method_handler),
        ("stream_stream", grpc.stream_stream_rpc_method_handler),
    )
    for kind, make in kinds:
        inner: _Behavior | None = getattr(handler, kind)
        if inner is not None:
            return make(
                admitted(inner),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
    return handler


def _admitted(inner: _Behavior, admit: _Admit, enter: _Enter, in_flight: InFlight) -> _Behavior:
    """A coroutine behavior that admits the call, then runs ``inner`` (in ``in_flight``).

    A streaming ``inner`` is driven here and its items written with
    ``context.write``, so it is always closed in the call's own task (its
    ``finally`` blocks, such as the detach at the end of Attach, run at once and
    in the call's context), never later by the garbage collector.
    """
    if inspect.isasyncgenfunction(inner):

        async def streaming(request: Any, context: Context) -> None:
            await admit(context)
            task = enter(context, principal=_principal.get())
            try:
                async with contextlib.aclosing(inner(request, context)) as items:
                    async for item in items:
                        await context.write(item)
            except asyncio.CancelledError:
                await in_flight.ended(context, task)
            finally:
                in_flight.leave(task)

        return streaming

    async def unary(request: Any, context: Context) -> Any:
        await admit(context)
        task = enter(context, principal=_principal.get())  # inline: a few µs a call less
        try:
            return await inner(request, context)
        except asyncio.CancelledError:
            await in_flight.ended(context, task)
        finally:
            in_flight.leave(task)

    return unary
