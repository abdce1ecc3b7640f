"""Authentication and authorization of every call: bearer tokens, scopes, the caller's tenant.

``Admitting`` wraps each method handler of the launch service once, as it is
registered, so each call is checked inside the task that runs it, before its
handler starts (a server interceptor would do the same at a cost on every call
of every service, the open ones too):

- The token comes from ``authorization: Bearer <token>`` metadata. Without a
  tokens file every caller is the default principal (the default tenant, its
  quotas, the ``launch`` scope): what may connect is decided by the Unix
  socket's permissions, or by ``--insecure`` on TCP. With a tokens file every
  call needs a valid token (``UNAUTHENTICATED`` otherwise), except calls on the
  Unix socket that carry none when the operator trusts it (``--unix-trusted``).
- Every call of the launch service needs the ``launch`` scope
  (``PERMISSION_DENIED`` otherwise, naming the token's scopes), but GetStatus
  and ListPipelines, which also take ``status`` (monitoring, without attaching)
  or ``admin`` (every tenant's numbers; catalog changes).
- A client id (``accy-client-id``) attached under another tenant is answered
  exactly as an unknown one: ``NOT_FOUND``.
- The health and reflection services need no token, so that container
  orchestrators and tools such as grpcurl can reach them.

The handler finds the principal with ``current_principal()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
import structlog

from accy.protocol import AUTHORIZATION_METADATA as AUTHORIZATION_HEADER
from accyd.core.ids import new_request_id
from accyd.core.tenants import Quotas
from accyd.doors.grpc.calls import CLIENT_ID_HEADER, Context, log_failure, remember_metadata
from accyd.doors.grpc.in_flight import Admitted, InFlight
from accyd.doors.grpc.status import to_status
from accyd.errors import AccyError, NotFound, PermissionDenied, Unauthenticated
from accyd.logs import Fields, bind_lazily
from accyd.tokens import Principal, TokenTable

__all__ = [
    "ADMIN_SCOPE",
    "AUTHORIZATION_HEADER",
    "LAUNCH_SCOPE",
    "OPEN_SERVICES",
    "STATUS_SCOPE",
    "Admitting",
    "Authenticator",
    "current_principal",
    "default_principal",
    "scopes_of",
]

OPEN_SERVICES = frozenset(
    {
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
        "grpc.reflection.v1.ServerReflection",
    }
)
"""Services callable without a token."""
LAUNCH_SCOPE = "launch"
STATUS_SCOPE = "status"
ADMIN_SCOPE = "admin"
_METHOD_SCOPES: dict[str, tuple[str, ...]] = {
    "GetStatus": (STATUS_SCOPE, LAUNCH_SCOPE, ADMIN_SCOPE),
    "ListPipelines": (STATUS_SCOPE, LAUNCH_SCOPE, ADMIN_SCOPE),
    "ReloadCatalog": (ADMIN_SCOPE,),
    # KServe's: a caller's own load or unload, or for an admin the catalog's.
    "RepositoryModelLoad": (LAUNCH_SCOPE, ADMIN_SCOPE),
    "RepositoryModelUnload": (LAUNCH_SCOPE, ADMIN_SCOPE),
}
"""The scopes that admit a call of each method (any one of them); others need ``launch``."""


def scopes_of(method: str) -> tuple[str, ...]:
    """The scopes that admit a call of ``method`` (``/package.Service/Name`` or ``Name``)."""
    return _METHOD_SCOPES.get(method.rsplit("/", 1)[-1], (LAUNCH_SCOPE,))


_principal: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "accy_principal", default=None
)

log = structlog.get_logger("accyd.doors.grpc")


def current_principal() -> Principal | None:
    """Who the call in progress comes from; ``None`` outside a checked call."""
    return _principal.get()


def default_principal(tenant: str, quotas: Quotas) -> Principal:
    """The principal of calls that need no token."""
    return Principal(tenant, frozenset({LAUNCH_SCOPE}), quotas, token=False)


def _with_defaults(quotas: Quotas, defaults: Quotas) -> Quotas:
    """A token's quotas, each one it leaves out taken from the defaults."""
    values: dict[str, int | None] = {}
    for item in dataclasses.fields(Quotas):
        own = getattr(quotas, item.name)
        values[item.name] = getattr(defaults, item.name) if own is None else own
    return Quotas(**values)


class Authenticator:
    """Turns a call's metadata and peer into its ``Principal``, or refuses it."""

    def __init__(
        self,
        tokens: TokenTable | None,
        default: Principal,
        *,
        unix_trusted: bool = False,
        tenant_of_client: Callable[[str], str | None] = lambda client_id: None,
    ) -> None:
        self.tokens = tokens
        self.default = default
        self.unix_trusted = unix_trusted
        self._tenant_of_client = tenant_of_client
        self._merged: dict[Principal, Principal] = {}

    def replace_tokens(self, tokens: TokenTable) -> None:
        """Check calls against ``tokens`` from now on (a reloaded tokens file)."""
        self.tokens = tokens
        self._merged = {}

    def principal(self, metadata: Sequence[tuple[str, Any]], peer: Callable[[], str]) -> Principal:
        """The caller: the default principal, or the token's (``Unauthenticated`` if invalid).

        ``peer`` gives the call's peer address (``unix:`` on the Unix socket).
        """
        if self.tokens is None:
            return self.default
        token = _bearer(metadata)
        if token is None and self.unix_trusted and peer().startswith("unix:"):
            return self.default
        found = self.tokens.authenticate(token)
        merged = self._merged.get(found)
        if merged is None:
            quotas = _with_defaults(found.quotas, self.default.quotas)
            merged = self._merged[found] = dataclasses.replace(found, quotas=quotas)
        return merged

    def check(
        self, metadata: Sequence[tuple[str, Any]], peer: Callable[[], str], *scopes: str
    ) -> Principal:
        """The caller, if it holds one of ``scopes`` and may use the client id it names."""
        principal = self.principal(metadata, peer)
        principal.require(*scopes)
        for key, value in metadata:
            if key == CLIENT_ID_HEADER and isinstance(value, str):
                tenant = self._tenant_of_client(value)
                if tenant is not None and tenant != principal.tenant:
                    # Worded as for an unknown id (ClientTable.get): nothing leaks.
                    raise NotFound(f"no attached client {value!r}", field="client_id")
        return principal


def _bearer(metadata: Sequence[tuple[str, Any]]) -> str | None:
    for key, value in metadata:
        if key == AUTHORIZATION_HEADER:
            scheme, _, token = str(value).strip().partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Unauthenticated("the authorization metadata must be 'Bearer <token>'")
            return token.strip()
    return None


_Behavior = Callable[..., Any]
_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")
_Handler = grpc.RpcMethodHandler


class _Admission:
    """Checks a call's credentials and scopes before its handler runs (``Admitting`` wraps
    each handler of the services it registers with it)."""

    def __init__(self, authenticator: Authenticator) -> None:
        self.authenticator = authenticator
        self._tenants: dict[str, Fields] = {}

    def admitter(self, method: str) -> Callable[[Context], Awaitable[None]]:
        """What admits a call of ``method`` (``/package.Service/Name``): its scopes found once."""
        return functools.partial(self._admit, method, scopes_of(method))

    def refusal(self, call: Admitted) -> AccyError | None:
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


UNDRAINED = frozenset({"Attach"})
"""Calls a stop ends by itself (``close_attach_streams``), not through ``InFlight.end_all``."""


class Admitting:
    """Registers a service's handlers on ``server``, each wrapped to admit its calls first.

    It stands in for the server in a generated ``add_*Servicer_to_server`` call.
    Services registered on the server directly (health, reflection) stay open.
    Every call it admits is in ``in_flight`` while it runs; ``revoke`` ends those that
    new tokens no longer admit.
    """

    def __init__(self, server: grpc.aio.Server, authenticator: Authenticator) -> None:
        self._server = server
        self._interceptor = _Admission(authenticator)
        self.in_flight = InFlight()

    def revoke(self) -> int:
        """After the tokens were replaced: end each call in flight (streams included) that
        they no longer admit as they did, saying why; how many."""
        return self.in_flight.end_where(self._interceptor.refusal)

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        """Ignored: the same handlers come again, by name, to the call below."""

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, _Handler[Any, Any]]
    ) -> None:
        interceptor = self._interceptor
        wrapped = {
            name: _wrap(
                handler,
                interceptor.admitter(f"/{service}/{name}"),
                functools.partial(
                    self.in_flight.enter,
                    scopes=scopes_of(name),
                    drained=name not in UNDRAINED,
                ),
                self.in_flight,
            )
            for name, handler in handlers.items()
        }
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, wrapped),)
        )
        self._server.add_registered_method_handlers(service, wrapped)

    def admitted(self, service: str, name: str, behavior: _Behavior) -> _Behavior:
        """``behavior`` (a handler taking request and context) admitted as this service's
        method ``name`` is, and counted in ``in_flight``: for a door whose calls reach a
        registered service's handlers through a context of its own (the KServe HTTP door)."""
        admit = self._interceptor.admitter(f"/{service}/{name}")
        enter = functools.partial(
            self.in_flight.enter, scopes=scopes_of(name), drained=name not in UNDRAINED
        )
        return _admitted(behavior, admit, enter, self.in_flight)


_Enter = Callable[..., asyncio.Task[Any]]
"""``InFlight.enter`` with the method's scopes and drain given: (context, principal)."""


def _wrap(
    handler: _Handler[_Req, _Resp],
    admit: Callable[[Context], Awaitable[None]],
    enter: _Enter,
    in_flight: InFlight,
) -> _Handler[_Req, _Resp]:
    """The same handler, with ``admit`` awaited before its behavior."""
    kinds = (
        ("unary_unary", grpc.unary_unary_rpc_method_handler),
        ("unary_stream", grpc.unary_stream_rpc_method_handler),
        ("stream_unary", grpc.stream_unary_rpc_method_handler),
        ("stream_stream", grpc.stream_stream_rpc_method_handler),
    )
    for name, make in kinds:
        inner: _Behavior | None = getattr(handler, name)
        if inner is not None:
            return make(
                _admitted(inner, admit, enter, in_flight),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
    return handler


def _admitted(
    inner: _Behavior,
    admit: Callable[[Context], Awaitable[None]],
    enter: _Enter,
    in_flight: InFlight,
) -> _Behavior:
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
