"""A flood of refused ring records writes a bounded log and says how much it left out."""

from __future__ import annotations

import re
import struct

import pytest

from accy._ring import Ring
from accy.protocol import ring as layout
from accyd.core.daemon import Daemon
from accyd.logs import flush_left_out
from accyd.ring import RingDoor


def test_a_flood_of_refused_ring_records_writes_a_bounded_log_and_a_summary(
    door: tuple[Daemon, RingDoor], caplog: pytest.LogCaptureFixture
) -> None:
    """The suite's logging is the daemon's own, routed to standard logging (``conftest``)."""
    daemon, ring_door = door
    client = daemon.attach("flood").id
    offer = ring_door.offer(client, 1024)
    ring = Ring.connect(ring_door.path, offer.ring_id, offer.ticket)
    flood = 3000
    flush_left_out()  # what earlier tests left out is said now, not in this test's count
    caplog.clear()
    try:
        for _ in range(flood):  # a launch on a session handle never bound: refused
            last = ring.launch(77, [], [], struct.pack("<I4x", 1), 1, notify=False, timeout=5.0)
        ring.wait(last, 10.0)
        assert len(ring.errors()) >= layout.error_slots() - 1
    finally:
        ring.close()
    flush_left_out()
    written = [record.getMessage() for record in caplog.records]
    refused = [line for line in written if "ring record refused" in line]
    summaries = [line for line in written if "log lines left out" in line and client in line]
    assert 0 < len(refused) <= 200, len(refused)
    assert summaries, "no line says what was left out"
    left_out = sum(int(re.search(r"left_out=(\d+)", line).group(1)) for line in summaries)  # type: ignore[union-attr]
    assert left_out >= flood - 200
