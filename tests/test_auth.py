"""Bearer tokens: hashed in the tokens file, checked in constant time, errors name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from accyd.errors import CatalogError, PermissionDenied, Unauthenticated
from accyd.tokens import TokenTable, hash_token, new_token


def tokens_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "tokens.toml"
    path.write_text(body)
    return path


def test_a_valid_token_names_its_tenant_scopes_and_quotas(tmp_path: Path) -> None:
    token, other = new_token(), new_token()
    assert token != other and len(token) >= 40
    path = tokens_file(
        tmp_path,
        f"""
[[token]]
tenant = "team-a"
sha256 = "{hash_token(token)}"
scopes = ["launch", "admin"]
[token.quotas]
memory_bytes = 1048576
sessions = 2

[[token]]
tenant = "team-b"
sha256 = "{hash_token(other).upper()}"
""",
    )
    table = TokenTable.load(path)
    assert len(table) == 2
    alice = table.authenticate(token)
    assert alice.tenant == "team-a"
    assert alice.scopes == {"launch", "admin"}
    assert alice.quotas.memory_bytes == 1048576
    assert alice.quotas.sessions == 2
    assert alice.quotas.buffers is None
    bob = table.authenticate(other)
    assert bob.tenant == "team-b"
    assert bob.scopes == {"launch"}
    bob.require("launch")
    with pytest.raises(PermissionDenied) as refused:
        bob.require("admin")
    assert str(refused.value) == "this call needs the 'admin' scope; the token's scopes: 'launch'"


def test_missing_or_wrong_tokens_are_unauthenticated(tmp_path: Path) -> None:
    table = TokenTable.load(
        tokens_file(tmp_path, f'[[token]]\ntenant = "a"\nsha256 = "{hash_token("x")}"\n')
    )
    with pytest.raises(Unauthenticated, match="needs 'authorization: Bearer"):
        table.authenticate(None)
    with pytest.raises(Unauthenticated, match="not valid"):
        table.authenticate("y")
    with pytest.raises(Unauthenticated, match="not valid"):
        table.authenticate(hash_token("x"))  # the hash itself is no token


@pytest.mark.parametrize(
    ("body", "field", "problem"),
    [
        ('[[token]]\nsha256 = "{h}"\n', "tenant", "is required"),
        ('[[token]]\ntenant = "a"\nsha256 = "abc"\n', "sha256", "64-hex-digit"),
        ('[[token]]\ntenant = "a"\nsha256 = "{h}"\nscopes = ["root"]\n', "scopes", "among"),
        ('[[token]]\ntenant = "a"\nsha256 = "{h}"\ncolour = 1\n', "colour", "not a known field"),
        (
            '[[token]]\ntenant = "a"\nsha256 = "{h}"\n[token.quotas]\ngpus = 1\n',
            "quotas.gpus",
            "not a known quota",
        ),
        (
            '[[token]]\ntenant = "a"\nsha256 = "{h}"\n[token.quotas]\nsessions = -1\n',
            "quotas.sessions",
            "non-negative",
        ),
    ],
)
def test_tokens_file_errors_name_the_entry_and_field(
    tmp_path: Path, body: str, field: str, problem: str
) -> None:
    path = tokens_file(tmp_path, body.replace("{h}", hash_token("t")))
    with pytest.raises(CatalogError) as caught:
        TokenTable.load(path)
    assert str(path) in str(caught.value)
    assert "token #1" in str(caught.value)
    assert repr(field) in str(caught.value)
    assert problem in str(caught.value)
