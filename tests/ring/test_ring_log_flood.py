"""A flood of refused ring records writes a bounded log and says how much it left out."""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from accy._ring import Ring
from accy.protocol import ring as layout
from accyd.core.daemon import Daemon
from accyd.logs import configure_logging, flush_left_out
from accyd.ring import RingDoor


@pytest.fixture
def logged() -> Iterator[io.StringIO]:
    """The daemon's logging as ``accyd serve`` configures it, into a buffer."""
    saved = structlog.get_config()
    stream = io.StringIO()
    configure_logging("json", "info", stream=stream)
    try:
        yield stream
    finally:
        structlog.configure(**saved)


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


def test_a_flood_of_refused_ring_records_writes_a_bounded_log_and_a_summary(
    door: tuple[Daemon, RingDoor], logged: io.StringIO
) -> None:
    daemon, ring_door = door
    client = daemon.attach("flood").id
    offer = ring_door.offer(client, 1024)
    ring = Ring.connect(ring_door.path, offer.ring_id, offer.ticket)
    flood = 3000
    try:
        for _ in range(flood):  # a launch on a session handle never bound: refused
            last = ring.launch(77, [], [], struct.pack("<I4x", 1), 1, notify=False, timeout=5.0)
        ring.wait(last, 10.0)
        assert len(ring.errors()) >= layout.error_slots() - 1
    finally:
        ring.close()
    flush_left_out()
    written = lines(logged)
    refused = [line for line in written if line["event"] == "ring record refused"]
    summaries = [line for line in written if line["event"] == "log lines left out"]
    assert 0 < len(refused) <= 200, len(refused)
    assert summaries, "no line says what was left out"
    assert all(line["client_id"] == client for line in summaries)
    assert sum(line["left_out"] for line in summaries) >= flood - 200
