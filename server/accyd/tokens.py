"""Bearer tokens: the tokens file, hashed tokens, tenants, scopes and quotas (no grpc here).

The operator's tokens file is TOML; it stores SHA-256 hashes of tokens, never
the tokens themselves (``accyd hash-token`` prints one). Quotas belong to the
tenant, one table each; a token names its tenant and its scopes:

    [tenant.team-a]                # any quota left out: the daemon's default
    memory_bytes = 8589934592
    sessions = 16
    buffers = 256
    launches_in_flight = 64

    [[token]]
    tenant = "team-a"
    sha256 = "9f86d08..."
    scopes = ["launch"]            # launch | status | admin

A ``[token.quotas]`` table (the older form) is still read, but every token of
a tenant, and its ``[tenant.NAME]`` table, must give the same quotas: a file
where they disagree is refused, naming both places.

A tenant's table may also confine its kernels to an SM partition and set its
streams' priority (``partition``, ``sm_share``, ``priority``; ``[partitions]``):
``accyd.token_placements`` reads those.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from accyd.backends.partitions import PartitionSpec
from accyd.core.tenants import Placement, Quotas
from accyd.errors import CatalogError, PermissionDenied, Unauthenticated
from accyd.token_placements import (
    PLACEMENT_FIELDS,
    check_shares,
    read_partitions,
    read_placement,
)

__all__ = ["SCOPES", "Principal", "TokenTable", "hash_token", "new_token"]

SCOPES = frozenset({"launch", "status", "admin"})
"""``launch``: every call of the launch service; ``status``: GetStatus and ListPipelines
alone, without attaching (monitoring); ``admin``: GetStatus of every tenant, and catalog
changes."""


def hash_token(token: str) -> str:
    """The hex SHA-256 of a token, as the tokens file stores it."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


TOKEN_PREFIX = "accy_"
"""Starts every token ``new_token`` makes: never a leading ``-`` (which a command line
would take for a flag: ``accy --token -x...``), and easy for secret scanners to spot."""


def new_token() -> str:
    """A fresh random token (256 bits), ``TOKEN_PREFIX`` first."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a call comes from: a tenant with scopes and quotas."""

    tenant: str
    scopes: frozenset[str]
    quotas: Quotas
    token: bool = True
    """Whether a token made it (else: a call without one, where the daemon lets it in)."""

    def require(self, scope: str, *also: str) -> None:
        """Refuse a caller that holds none of the scopes given, naming the scopes it holds."""
        if self.scopes.isdisjoint((scope, *also)):
            wanted = " or ".join(repr(name) for name in (scope, *also))
            held = ", ".join(repr(name) for name in sorted(self.scopes)) or "none"
            whose = "the token's scopes" if self.token else "a call without a token has scopes"
            raise PermissionDenied(f"this call needs the {wanted} scope; {whose}: {held}")


class TokenTable:
    """Tokens by hash; ``authenticate`` turns a presented token into a ``Principal``."""

    def __init__(
        self,
        entries: Iterable[tuple[str, Principal]] = (),
        *,
        partitions: Iterable[PartitionSpec] = (),
        placements: Mapping[str, Placement] | None = None,
    ) -> None:
        self._by_hash: dict[str, Principal] = {}
        for digest, principal in entries:
            self._by_hash[digest] = principal
        self.partitions = tuple(partitions)
        """The SM partitions to make on each device, in the file's order."""
        self.placements = dict(placements or {})
        """Each tenant's partition and priority, for tenants whose table gives one."""

    @property
    def tenant_quotas(self) -> dict[str, Quotas]:
        """Each tenant's quotas, as the file gives them."""
        return {p.tenant: p.quotas for p in self._by_hash.values()}

    def __len__(self) -> int:
        return len(self._by_hash)

    def authenticate(self, token: str | None) -> Principal:
        if not token:
            raise Unauthenticated("this call needs 'authorization: Bearer <token>' metadata")
        digest = hash_token(token)
        for known, principal in self._by_hash.items():
            if hmac.compare_digest(known, digest):
                return principal
        raise Unauthenticated("the bearer token is not valid")

    @classmethod
    def load(cls, path: Path) -> TokenTable:
        """Read a tokens file; an error names the file, the entry and the field."""
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as error:
            raise CatalogError(f"{path}: cannot read: {error.strerror}") from None
        except tomllib.TOMLDecodeError as error:
            raise CatalogError(f"{path}: not valid TOML: {error}") from None
        unknown = set(data) - {"token", "tenant", "partitions"}
        if unknown:
            raise CatalogError(
                f"{path}: unknown tables {sorted(unknown)}; expected [tenant.NAME], [[token]] "
                "and [partitions]"
            )
        raw = data.get("token", [])
        if not isinstance(raw, list):
            raise CatalogError(f"{path}: 'token' must be an array of tables ([[token]])")
        partitions = read_partitions(path, data.get("partitions", {}))
        placements: dict[str, Placement] = {}
        quotas = _tenant_tables(path, data.get("tenant", {}), partitions, placements)
        check_shares(path, partitions)
        entries = [_entry(path, index, item, quotas) for index, item in enumerate(raw)]
        return cls(
            (
                (
                    digest,
                    Principal(tenant, scopes, quotas[tenant][0] if tenant in quotas else Quotas()),
                )
                for digest, tenant, scopes in entries
            ),
            partitions=partitions.values(),
            placements=placements,
        )


_Quotas = dict[str, tuple[Quotas, str]]
"""Each tenant's quotas, and where in the file they were given."""


def _tenant_tables(
    path: Path,
    raw: Any,
    partitions: dict[str, PartitionSpec],
    placements: dict[str, Placement],
) -> _Quotas:
    """Each tenant's quotas; its partition and priority go into ``placements``."""
    if not isinstance(raw, dict):
        raise CatalogError(f"{path}: 'tenant' must hold one table per tenant ([tenant.NAME])")
    found: _Quotas = {}
    for name, table in raw.items():
        where = f"[tenant.{name}]"

        def fail(field: str, problem: str, where: str = where) -> CatalogError:
            return CatalogError(f"{path}: {where}: field {field!r}: {problem}", field=field)

        if isinstance(table, Mapping):
            placement = read_placement(table, name, partitions, fail)
            if placement is not None:
                placements[name] = placement
            table = {k: v for k, v in table.items() if k not in PLACEMENT_FIELDS}
        found[name] = (_quotas(table, fail, prefix=""), where)
    return found


def _entry(path: Path, index: int, item: Any, quotas: _Quotas) -> tuple[str, str, frozenset[str]]:
    """One token: its hash, tenant and scopes; its quotas (if any) go into ``quotas``."""
    where = f"token #{index + 1}"

    def fail(field: str, problem: str) -> CatalogError:
        return CatalogError(f"{path}: {where}: field {field!r}: {problem}", field=field)

    if not isinstance(item, dict):
        raise fail("token", "must be a table")
    for key in item:
        if key not in {"tenant", "sha256", "scopes", "quotas"}:
            raise fail(key, "is not a known field (quotas, scopes, sha256, tenant)")
    tenant = item.get("tenant")
    if not isinstance(tenant, str) or not tenant:
        raise fail("tenant", "is required: a non-empty string")
    digest = item.get("sha256")
    if not isinstance(digest, str) or len(digest) != 64 or not _is_hex(digest):
        raise fail("sha256", "must be the 64-hex-digit SHA-256 of the token (accyd hash-token)")
    scopes = item.get("scopes", ["launch"])
    if not isinstance(scopes, list) or not all(s in SCOPES for s in scopes):
        raise fail("scopes", f"must list scopes among {sorted(SCOPES)}")
    if "quotas" in item:
        own = _quotas(item["quotas"], fail)
        known = quotas.get(tenant)
        if known is None:
            quotas[tenant] = (own, where)
        elif known[0] != own:
            raise fail(
                "quotas",
                f"tenant {tenant!r} has other quotas in {known[1]}; quotas belong to the "
                f"tenant: give them once, in [tenant.{tenant}]",
            )
    return digest.lower(), tenant, frozenset(scopes)


def _is_hex(text: str) -> bool:
    try:
        int(text, 16)
    except ValueError:
        return False
    return True


def _quotas(raw: Any, fail: Any, prefix: str = "quotas.") -> Quotas:
    if not isinstance(raw, Mapping):
        raise fail(prefix.rstrip(".") or "tenant", "must be a table")
    names = {f.name for f in fields(Quotas)}
    values: dict[str, int] = {}
    for key, value in raw.items():
        if key not in names:
            raise fail(f"{prefix}{key}", f"is not a known quota ({', '.join(sorted(names))})")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise fail(f"{prefix}{key}", "must be a non-negative integer")
        values[key] = value
    return Quotas(**values)
