"""Who a call comes from and what it may do: bearer tokens, scopes, the caller's tenant.

``Authenticator.check`` is the rule; ``accyd.doors.grpc.admission`` applies it to
every call before its handler starts (the server's interceptor, and the KServe
HTTP door's routes):

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

The handler finds the principal with ``current_principal()``
(``accyd.doors.grpc.admission``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from accy.protocol import AUTHORIZATION_METADATA as AUTHORIZATION_HEADER
from accyd.core.tenants import Quotas
from accyd.doors.grpc.calls import CLIENT_ID_HEADER
from accyd.errors import NotFound, Unauthenticated
from accyd.tokens import Principal, TokenTable

__all__ = [
    "ADMIN_SCOPE",
    "AUTHORIZATION_HEADER",
    "LAUNCH_SCOPE",
    "OPEN_SERVICES",
    "STATUS_SCOPE",
    "Authenticator",
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
