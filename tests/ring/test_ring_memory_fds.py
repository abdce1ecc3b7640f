"""A closed ring's descriptor numbers are never used again by its memory.

A number closed here is soon another's: a new client's TCP socket. A copy thread's
``wake_client`` after its ring closed once wrote the eventfd's 8 bytes into such a
socket, and that client's gRPC saw them as an HTTP/2 frame header ("Expected SETTINGS
frame as the first frame, got frame type 0") and lost its connection.
"""

from __future__ import annotations

import os
import socket

import pytest

from accyd.ring.memory import RingMemory


@pytest.mark.parametrize("shared", [True, False])
def test_wakes_and_drains_after_close_touch_no_reused_descriptor(shared: bool) -> None:
    ours, theirs = socket.socketpair()  # first: the ring's numbers are not theirs
    memory = RingMemory(16, shared=shared)
    submit, complete = memory.submit_fd, memory.complete_fd
    memory.close()
    reused = []
    try:
        for number in (submit, complete):  # another's sockets, at the ring's old numbers
            os.dup2(ours.fileno(), number)
            reused.append(number)
        theirs.sendall(b"their bytes")
        memory.wake_client()
        memory.drain_submit()
        memory.drain_complete()
        theirs.setblocking(False)
        with pytest.raises(BlockingIOError):
            theirs.recv(64)  # nothing was written into their socket
        assert os.read(complete, 64) == b"their bytes"  # nothing was read out of it
        memory.kick()  # a ring stream's handler, after the engine let the ring go
        memory.close()  # idempotent: closes nothing of theirs
        with pytest.raises(BlockingIOError):
            theirs.recv(64)
        os.fstat(submit)  # still open: theirs
    finally:
        for number in reused:
            os.close(number)
        ours.close()
        theirs.close()
