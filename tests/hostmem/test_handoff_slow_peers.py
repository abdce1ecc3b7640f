"""The handoff socket under slow peers: one that trickles or stalls holds up no one else."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from accy._handoff import take
from accyd.doors.hostmem.handoff import HELLO_SECONDS, Handoff, Offered


@pytest.fixture
def handoff(tmp_path: Path) -> Iterator[Handoff]:
    door = Handoff(tmp_path / "accyd.sock")
    door.start()
    try:
        yield door
    finally:
        door.close()


def offer_one(door: Handoff, name: str) -> tuple[bytes, int]:
    """Offer a pipe's read end as ``name``; its ticket and the descriptor offered."""
    read_end, write_end = os.pipe()
    os.close(write_end)
    ticket = door.offer(Offered(name, "client", lambda: [read_end], sent=lambda: None))
    return ticket, read_end


def trickle(path: Path, stop: threading.Event, period: float) -> None:
    """A peer that sends one byte of its hello every ``period`` seconds until cut off."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(path))
        with contextlib.suppress(OSError):
            while not stop.wait(period):
                conn.send(b"x")


def test_peers_that_trickle_or_stall_do_not_delay_a_handoff(handoff: Handoff) -> None:
    stop = threading.Event()
    slow = [
        threading.Thread(target=trickle, args=(handoff.path, stop, period), daemon=True)
        for period in [0.3] * 8 + [10.0] * 8  # bytes now and then, and none at all
    ]
    for thread in slow:
        thread.start()
    opened: list[int] = []
    try:
        time.sleep(0.5)  # every slow peer is connected and sending (or not)
        for round_ in range(5):
            ticket, offered = offer_one(handoff, f"thing-{round_}")
            opened.append(offered)
            started = time.monotonic()
            fds = take(handoff.path, f"thing-{round_}", ticket, 1, timeout=5.0)
            took = time.monotonic() - started
            opened.extend(fds)
            assert took < 0.5, f"a handoff behind slow peers took {took:.2f} s"
        # Each slow peer is cut off once its hello's time is up.
        deadline = time.monotonic() + HELLO_SECONDS + 2.0
        while handoff.refused_connections < len(slow) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert handoff.refused_connections >= len(slow)
    finally:
        stop.set()
        for fd in opened:
            os.close(fd)
        for thread in slow:
            thread.join(5)
