"""The tokens file: quotas belong to the tenant, a status scope, and SIGHUP reloads the file."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from accy.protocol.launch.v1 import launch_pb2 as pb
from accyd.core.tenants import Quotas
from accyd.errors import CatalogError
from accyd.tokens import TokenTable, hash_token, new_token
from tests.launch_service.harness import details, rpc_error
from tests.security.harness import Caller, serving_with_tokens


def token_lines(tenant: str, token: str, scopes: str = '"launch"', quotas: str = "") -> str:
    lines = f'[[token]]\ntenant = "{tenant}"\nsha256 = "{hash_token(token)}"\nscopes = [{scopes}]\n'
    return lines + (f"[token.quotas]\n{quotas}\n" if quotas else "")


def test_every_token_of_a_tenant_gets_the_tenants_quotas(tmp_path: Path) -> None:
    one, two = new_token(), new_token()
    path = tmp_path / "tokens.toml"
    path.write_text(
        "[tenant.team-a]\nbuffers = 1\nsessions = 3\n\n"
        + token_lines("team-a", one)
        + token_lines("team-a", two, '"launch", "admin"')
    )
    table = TokenTable.load(path)
    assert table.authenticate(one).quotas == table.authenticate(two).quotas
    assert table.tenant_quotas == {"team-a": Quotas(buffers=1, sessions=3)}


@pytest.mark.parametrize(
    ("head", "second_quotas", "where"),
    [
        ("", "buffers = 2", "token #1"),
        ("[tenant.team-a]\nbuffers = 1\n\n", "buffers = 2", r"\[tenant.team-a\]"),
    ],
)
def test_tokens_that_disagree_on_a_tenants_quotas_are_refused(
    tmp_path: Path, head: str, second_quotas: str, where: str
) -> None:
    path = tmp_path / "tokens.toml"
    first = token_lines("team-a", new_token(), quotas="buffers = 1") if not head else ""
    second = token_lines("team-a", new_token(), quotas=second_quotas)
    path.write_text(head + first + second)
    with pytest.raises(CatalogError, match=rf"tenant 'team-a' has other quotas in {where}"):
        TokenTable.load(path)


def test_quotas_no_longer_follow_the_last_token_attached(tmp_path: Path) -> None:
    limited, other = new_token(), new_token()
    path = tmp_path / "tokens.toml"
    path.write_text(
        "[tenant.team-a]\nbuffers = 1\n\n"
        + token_lines("team-a", limited)
        + token_lines("team-a", other)
    )
    running = serving_with_tokens(tmp_path, "unix", path)
    try:
        with grpc.insecure_channel(running.address) as channel:
            first, second = Caller(channel, limited), Caller(channel, other)
            first.attach()
            second.attach()
            first.buffer(16)
            error = rpc_error(lambda: second.buffer(16))
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert details(error)["ErrorInfo"].metadata["quota"] == "buffers"
            first.detach()
            second.detach()
    finally:
        running.stop()


def test_a_status_or_admin_token_reads_status_without_attaching(tmp_path: Path) -> None:
    launcher, monitor, admin = new_token(), new_token(), new_token()
    path = tmp_path / "tokens.toml"
    path.write_text(
        token_lines("team-a", launcher)
        + token_lines("mon", monitor, '"status"')
        + token_lines("ops", admin, '"admin"')
    )
    running = serving_with_tokens(tmp_path, "unix", path)
    try:
        with grpc.insecure_channel(running.address) as channel:
            user = Caller(channel, launcher)
            user.attach()
            watching = Caller(channel, monitor)
            assert watching.status().tenant == "mon"
            denied = rpc_error(lambda: watching.attach())
            assert denied.code() == grpc.StatusCode.PERMISSION_DENIED
            every = Caller(channel, admin).status()
            assert "team-a" in {tenant.name for tenant in every.tenants}
            assert "team-a" not in {tenant.name for tenant in watching.status().tenants}
            user.detach()
    finally:
        running.stop()


def test_sighup_reloads_the_tokens_file_without_dropping_clients(tmp_path: Path) -> None:
    old, new = new_token(), new_token()
    path = tmp_path / "tokens.toml"
    path.write_text(token_lines("team-a", old))
    address = f"unix:{tmp_path / 'accyd.sock'}"
    process = subprocess.Popen(
        [sys.executable, "-m", "accyd.cli", "serve", "--backend", "host", "--log-format",
         "json", "--tokens", str(path), "--listen", address],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert process.stderr is not None
        assert json.loads(process.stderr.readline())["event"] == "accyd serving"
        with grpc.insecure_channel(address) as channel:
            attached = Caller(channel, old)
            attached.attach()
            buffer = attached.buffer(64)
            refused = rpc_error(lambda: Caller(channel, new).status())
            assert refused.code() == grpc.StatusCode.UNAUTHENTICATED
            path.write_text(token_lines("team-a", old) + token_lines("team-b", new))
            process.send_signal(signal.SIGHUP)  # to the supervisor, which passes it on
            deadline = time.monotonic() + 10
            while True:
                try:
                    assert Caller(channel, new).status().tenant == "team-b"
                    break
                except grpc.RpcError:
                    assert time.monotonic() < deadline, "the new token was not loaded"
                    time.sleep(0.05)
            reply = attached.ReadBuffer(pb.ReadBufferRequest(buffer_id=buffer))
            assert sum(len(chunk.data) for chunk in reply) == 64  # still attached
            attached.detach()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
