"""The native engine on a ring the device launcher serves: it takes only what the GPU left.

The GPU is played here by the test: it counts ``done`` up for the records it served and
writes ``left`` for the one it leaves to the CPU path, as the launcher's kernel does
(``backends/cuda/launcher_source.py``). Nothing here needs a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from accy.protocol import ring as layout
from tests.engine.test_native_engine import EXEC, STREAM, TOKEN, Harness, native
from tests.waiting import eventually


@pytest.fixture
def served() -> Iterator[Harness]:
    h = Harness(device=True)
    try:
        yield h
    finally:
        h.close()


def word(h: Harness, offset: int) -> int:
    return h.memory.u64(offset)


def device_serves(h: Harness, done: int, left: int = 0) -> None:
    """What the launcher writes: ``done`` for the records it served, then ``left``."""
    h.memory.set_u64(layout.DONE, done)  # one store each, as the GPU's (not a memset)
    if left:
        h.memory.set_u64(layout.LEFT, left)


def left_first_then_ticketed(h: Harness) -> None:
    """Record 0 left by the GPU, decided by Python with a ticket for its launch, and over
    (the GPU goes on only then)."""
    first = h.publish()
    device_serves(h, done=0, left=1)
    h.client._kick()
    h.slow()
    h.engine.resume(1, first + 1, [(0, STREAM, TOKEN)], [h.ticket(first)])
    h.finish(first)
    assert eventually(lambda: word(h, layout.DONE) == 1)


def test_the_engine_takes_nothing_the_device_did_not_leave(served: Harness) -> None:
    h = served
    for _ in range(3):
        h.publish()
    time.sleep(0.1)
    assert h.engine.take_slow(0.05) == []
    assert word(h, layout.TAIL) == 0 and h.driver.launches == []


def test_a_record_left_to_the_cpu_path_is_decided_by_python_after_the_devices(
    served: Harness,
) -> None:
    h = served
    seqs = [h.publish() for _ in range(3)]
    device_serves(h, done=2, left=3)  # served 0 and 1, left 2
    h.client._kick()
    [item] = h.slow()
    assert item == (native.SLOW_RECORD, 1, seqs[2], 0, -1)
    assert word(h, layout.TAIL) == 2  # the device's records count as taken
    h.engine.resume(1, 3, [(0, STREAM, TOKEN)], [h.ticket(2)])
    h.finish(2)
    assert eventually(lambda: word(h, layout.DONE) == 3)


def test_a_left_record_with_a_ticket_launches_from_the_cpu_without_python(
    served: Harness,
) -> None:
    h = served
    left_first_then_ticketed(h)
    later = [h.publish() for _ in range(3)]  # the same launch: the ticket matches
    time.sleep(0.05)
    assert h.driver.launches == []  # the device's to serve, not the engine's
    device_serves(h, done=3, left=4)  # served 1 and 2, left 3 (its launch failed there)
    h.client._kick()
    assert eventually(lambda: h.driver.launches == [(EXEC, STREAM)])
    h.finish(later[-1])
    assert eventually(lambda: word(h, layout.DONE) == later[-1] + 1)
    assert h.engine.take_slow(0.05) == []


def test_a_left_word_past_the_head_breaks_only_that_ring(served: Harness) -> None:
    h = served
    h.publish()  # head 1
    device_serves(h, done=0, left=5)  # the client wrote it: not the GPU
    h.client._kick()
    [item] = h.slow()
    assert item[0] == native.SLOW_BROKEN


def test_a_head_past_the_window_breaks_a_served_ring_without_a_kick(served: Harness) -> None:
    h = served
    h.publish()
    h.memory.set_u64(layout.HEAD, 64 + 5)  # past done + slots
    [item] = h.slow(timeout=3.0)  # found by the engine's look at idle rings, not a kick
    assert item[0] == native.SLOW_BROKEN


def test_a_ring_handed_back_to_the_engine_goes_on_from_what_the_device_finished(
    served: Harness,
) -> None:
    h = served
    left_first_then_ticketed(h)
    later = [h.publish() for _ in range(4)]
    device_serves(h, done=3)  # the device served 1 and 2, then was stopped and drained
    h.engine.set_device(1, False)
    # 3 and 4, on the ticket; not 1 and 2 again: what the device took counts as taken
    assert eventually(lambda: len(h.driver.launches) == 2 and word(h, layout.TAIL) == 5)
    time.sleep(0.05)
    assert len(h.driver.launches) == 2
    h.finish(later[-1])
    assert eventually(lambda: word(h, layout.DONE) == later[-1] + 1)


def test_a_ring_given_to_the_device_is_no_longer_taken_by_the_engine() -> None:
    h = Harness()
    try:
        first = h.publish()
        h.slow()
        assert not h.engine.set_device(1, True)  # refused: its record is with Python
        h.engine.resume(1, first + 1, [(0, STREAM, TOKEN)], [h.ticket(first)])
        h.finish(first)
        assert eventually(lambda: h.engine.set_device(1, True))  # once its flight is over
        assert word(h, layout.DONE) == word(h, layout.TAIL) == 1
        h.publish()  # the same launch: the engine's ticket matches, yet it is the device's
        time.sleep(0.05)
        assert h.driver.launches == [] and word(h, layout.TAIL) == 1
        with pytest.raises(KeyError):
            h.engine.set_device(9, True)
    finally:
        h.close()
