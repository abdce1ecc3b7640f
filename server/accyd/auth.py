"""Bearer tokens: the tokens file, hashed tokens, tenants, scopes and quotas (no grpc here).

The operator's tokens file is TOML; it stores SHA-256 hashes of tokens, never
the tokens themselves (``accyd hash-token`` prints one):

    [[token]]
    tenant = "team-a"
    sha256 = "9f86d08..."
    scopes = ["launch"]            # launch | admin
    [token.quotas]
    memory_bytes = 8589934592
    sessions = 16
    buffers = 256
    launches_in_flight = 64
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

from accyd.core.tenants import Quotas
from accyd.errors import CatalogError, PermissionDenied, Unauthenticated

__all__ = ["SCOPES", "Principal", "TokenTable", "hash_token", "new_token"]

SCOPES = frozenset({"launch", "admin"})


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

    def require(self, scope: str) -> None:
        if scope not in self.scopes:
            raise PermissionDenied(f"tenant {self.tenant!r} lacks the {scope!r} scope")


class TokenTable:
    """Tokens by hash; ``authenticate`` turns a presented token into a ``Principal``."""

    def __init__(self, entries: Iterable[tuple[str, Principal]] = ()) -> None:
        self._by_hash: dict[str, Principal] = {}
        for digest, principal in entries:
            self._by_hash[digest] = principal

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
        unknown = set(data) - {"token"}
        if unknown:
            raise CatalogError(f"{path}: unknown tables {sorted(unknown)}; expected [[token]]")
        raw = data.get("token", [])
        if not isinstance(raw, list):
            raise CatalogError(f"{path}: 'token' must be an array of tables ([[token]])")
        return cls(_entry(path, index, item) for index, item in enumerate(raw))


def _entry(path: Path, index: int, item: Any) -> tuple[str, Principal]:
    where = f"{path}: token #{index + 1}"

    def fail(field: str, problem: str) -> CatalogError:
        return CatalogError(f"{where}: field {field!r}: {problem}", field=field)

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
    return digest.lower(), Principal(
        tenant, frozenset(scopes), _quotas(item.get("quotas", {}), fail)
    )


def _is_hex(text: str) -> bool:
    try:
        int(text, 16)
    except ValueError:
        return False
    return True


def _quotas(raw: Any, fail: Any) -> Quotas:
    if not isinstance(raw, Mapping):
        raise fail("quotas", "must be a table")
    names = {f.name for f in fields(Quotas)}
    values: dict[str, int] = {}
    for key, value in raw.items():
        if key not in names:
            raise fail(f"quotas.{key}", f"is not a known quota ({', '.join(sorted(names))})")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise fail(f"quotas.{key}", "must be a non-negative integer")
        values[key] = value
    return Quotas(**values)
