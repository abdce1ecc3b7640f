"""Fixtures of the KServe door's tests: daemons (host backend), the outside tools, stubs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from accy.testing import RunningDaemon, running_daemon
from tests.kserve.harness import TENANTS, Tools, daemon_of, find_tools
from tests.security.harness import write_tokens


@pytest.fixture(scope="session")
def tools() -> Tools:
    """tritonclient's environment and perf_analyzer (``scripts/kserve_tools.sh``)."""
    found = find_tools()
    if isinstance(found, str):
        if os.environ.get("CI"):
            pytest.fail(f"CI must install the KServe tools: {found}")
        pytest.skip(found)
    return found


@pytest.fixture(scope="session")
def plain() -> Iterator[RunningDaemon]:
    """A daemon without tokens, on a Unix socket and TCP loopback."""
    with running_daemon(backend="host", extra=["--no-supervise"]) as running:
        yield running
        assert running.process.poll() is None, f"accyd died:\n{running.log_text()}"


@pytest.fixture(scope="session")
def token_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kserve-tokens")


@pytest.fixture(scope="session")
def tokens(token_folder: Path) -> dict[str, str]:
    """A token for each of the two tenants, ``alpha`` and ``beta``."""
    return write_tokens(token_folder / "tokens.toml", TENANTS)


@pytest.fixture(scope="session")
def guarded(token_folder: Path, tokens: dict[str, str]) -> Iterator[RunningDaemon]:
    """A daemon whose every call needs a token (TCP without TLS: the loopback only)."""
    extra = ["--no-supervise", "--tokens", str(token_folder / "tokens.toml")]
    with running_daemon(backend="host", extra=extra) as running:
        yield running
        assert running.process.poll() is None, f"accyd died:\n{running.log_text()}"


@pytest.fixture(scope="session")
def daemons(plain: RunningDaemon, guarded: RunningDaemon) -> dict[str, RunningDaemon]:
    return {"plain": plain, "guarded": guarded}


__all__ = ["daemon_of"]
