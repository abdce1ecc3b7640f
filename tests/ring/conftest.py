"""The ring tests' daemon: the host backend behind a ring door on a temporary socket path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from accyd.core.daemon import Daemon
from accyd.ring import RingDoor
from tests.core.daemon_fixtures import host_daemon


@pytest.fixture
def door(tmp_path: Path) -> Iterator[tuple[Daemon, RingDoor]]:
    daemon, _ = host_daemon()
    ring_door = RingDoor(daemon, tmp_path / "accyd.sock")
    ring_door.start()
    try:
        yield daemon, ring_door
    finally:
        ring_door.close()
        daemon.close()
