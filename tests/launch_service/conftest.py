"""Fixtures: one server per transport (Unix socket, TCP loopback) and attached clients."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.launch_service.harness import Attached, ServerThread, attach, make_config


@pytest.fixture(scope="module", params=["unix", "tcp"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerThread]:
    folder = Path(tmp_path_factory.mktemp("accyd", numbered=True))
    running = ServerThread(make_config(folder, request.param))
    yield running
    running.stop()


@pytest.fixture
def channel(server: ServerThread) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.address) as opened:
        yield opened


@pytest.fixture
def client(channel: grpc.Channel) -> Iterator[Attached]:
    attached = attach(channel)
    yield attached
    attached.detach()
