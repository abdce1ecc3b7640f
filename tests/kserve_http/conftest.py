"""Fixtures of the KServe HTTP door's tests: daemons (host backend) serving it on the loopback."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from accy.testing import RunningDaemon, free_port, running_daemon
from tests.kserve.conftest import tools as grpc_tools
from tests.kserve.harness import TENANTS, Tools
from tests.security.harness import write_tokens

__all__ = ["grpc_tools"]


@pytest.fixture(scope="session")
def tools(grpc_tools: Tools) -> Tools:
    """The KServe tools, with tritonclient's http extra (installed since it was added)."""
    done = subprocess.run(
        [str(grpc_tools.python), "-c", "import tritonclient.http"], capture_output=True, check=False
    )
    if done.returncode != 0:
        message = "tritonclient.http is not installed: run scripts/kserve_tools.sh again"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return grpc_tools


@dataclass(frozen=True)
class HttpDaemon:
    """A daemon and where its KServe HTTP door listens (``host:port``)."""

    daemon: RunningDaemon
    http: str

    @property
    def base(self) -> str:
        return f"http://{self.http}"


def _serving(extra: list[str]) -> Iterator[HttpDaemon]:
    http = f"127.0.0.1:{free_port()}"
    flags = ["--no-supervise", "--kserve-http-listen", http, *extra]
    with running_daemon(backend="host", extra=flags) as running:
        yield HttpDaemon(running, http)
        assert running.process.poll() is None, f"accyd died:\n{running.log_text()}"


@pytest.fixture(scope="session")
def plain_http() -> Iterator[HttpDaemon]:
    """A daemon without tokens (``--insecure``), its HTTP door on the loopback."""
    yield from _serving([])


@pytest.fixture(scope="session")
def http_tokens(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    folder = tmp_path_factory.mktemp("kserve-http-tokens")
    return folder / "tokens.toml", write_tokens(folder / "tokens.toml", TENANTS)


@pytest.fixture(scope="session")
def guarded_http(http_tokens: tuple[Path, dict[str, str]]) -> Iterator[HttpDaemon]:
    """A daemon whose every call needs a token, its HTTP door on the loopback."""
    yield from _serving(["--tokens", str(http_tokens[0])])
