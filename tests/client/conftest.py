"""Fixtures of the client unit tests: the in-process service double on a Unix socket."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import pytest

from accy.client import Client
from tests.client.fake_daemon import FakeLaunchService, serve


@pytest.fixture
def fake() -> Iterator[tuple[str, FakeLaunchService]]:
    """A running double and its ``unix:`` target."""
    folder = tempfile.mkdtemp(prefix="accy-")
    target = f"unix:{folder}/fake.sock"
    server, service = serve(target)
    try:
        yield target, service
    finally:
        server.stop(grace=None)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def client(fake: tuple[str, FakeLaunchService]) -> Iterator[Client]:
    """A client attached to the double."""
    with Client(fake[0], client_name="unit") as c:
        yield c
