"""The native engine's tickets with free scalars: records match whatever values they carry in
those fields, the driver is asked to patch the launch before each new value, a float that is
not finite goes to Python, and a free spec that does not hold is refused at ``resume``."""

from __future__ import annotations

import math
import struct
import time

import pytest

from tests.engine.test_native_engine import EXEC, SCALARS, STREAM, TOKEN, Harness
from tests.waiting import eventually

native = pytest.importorskip("accyd.ring.engine._native", reason="the native engine is not built")

A_FIELD = 1
"""The harness's records carry (n: u32, a: f32): ``a`` is the free one."""
F32_EXPONENT = 0x7F800000
FREE = (1 << A_FIELD, bytes([0, 4, 0, 0, 0, 0, 0, 0]), (0, F32_EXPONENT, 0, 0, 0, 0, 0, 0))


def masked_ticket(h: Harness, seq: int, free: object = FREE) -> tuple[object, ...]:
    key = bytearray(h.key(seq))
    at = 84 - 12 + 8 * A_FIELD
    key[at : at + 8] = bytes(8)
    return (bytes(key), 0, EXEC, STREAM, TOKEN, 0, h.engine.epoch(0), free)


def decide(h: Harness, seq: int, ticket: object = None) -> None:
    """Record ``seq`` went to Python: resume after it, installing ``ticket`` if given."""
    [item] = h.slow()
    assert item == (native.SLOW_RECORD, 1, seq, 0, -1)
    h.engine.resume(1, seq + 1, [(0, STREAM, TOKEN)], [ticket] if ticket else [])


def masked_first_sight(h: Harness) -> int:
    """Publish a launch with a = 1.0 and decide it as Python would: a ticket for every a."""
    first = h.publish(a=1.0)
    decide(h, first, masked_ticket(h, first))
    return first


def patched_values(h: Harness) -> list[float]:
    values = []
    for exec_handle, scalars, mask in h.driver.patches:
        assert (exec_handle, mask) == (EXEC, 1 << A_FIELD)
        values.append(SCALARS.unpack(scalars)[1])
    return values


def test_every_value_of_a_free_scalar_is_launched_without_python(harness: Harness) -> None:
    h = harness
    masked_first_sight(h)
    run = [h.publish(a=a) for a in (2.0, 2.0, 3.0, -0.0, 3.0)]
    assert eventually(lambda: len(h.driver.launches) == 5)
    h.finish(run[-1])
    assert eventually(lambda: h.client.done == run[-1] + 1)
    assert h.engine.take_slow(0.0) == []
    # one patch per run of equal values, each before that run's launches
    assert patched_values(h) == [2.0, 3.0, -0.0, 3.0]
    assert math.copysign(1.0, patched_values(h)[2]) == -1.0
    assert h.engine.stats()["calls"]["patch"] == 4


def test_a_value_the_launch_was_given_last_is_not_patched_again(harness: Harness) -> None:
    h = harness
    masked_first_sight(h)
    seqs = []
    for _ in range(3):  # waited one by one: three runs of one record each
        seqs.append(h.publish(a=5.0))
        h.finish(seqs[-1])
        assert eventually(lambda: h.client.done == seqs[-1] + 1)
    assert patched_values(h) == [5.0]  # after a resume: patched once, then known
    assert len(h.driver.launches) == 3


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_a_float_that_is_not_finite_goes_to_python(harness: Harness, value: float) -> None:
    h = harness
    masked_first_sight(h)
    bad = h.publish(a=value)
    decide(h, bad)  # Python refuses it (here: resumed without a ticket)
    assert h.driver.launches == [] and h.driver.patches == []
    good = h.publish(a=4.0)
    assert eventually(lambda: len(h.driver.launches) == 1)
    h.finish(good)
    assert patched_values(h) == [4.0]


def test_a_scalar_that_is_not_free_still_keys_the_ticket(harness: Harness) -> None:
    h = harness
    first = h.publish(n=4, a=1.0)
    decide(h, first, masked_ticket(h, first))
    other = h.publish(n=5, a=1.0)
    decide(h, other)
    assert h.driver.launches == [] and h.driver.patches == []


def test_a_failed_patch_fails_that_record_and_the_next_patches_again(harness: Harness) -> None:
    h = harness
    masked_first_sight(h)
    h.driver.fail_patch = 999
    failed = h.publish(a=2.0)
    [item] = h.slow()
    assert item[:4] == (native.SLOW_LAUNCH_FAILED, 1, failed, 999)
    assert h.driver.launches == []
    h.engine.resume(1, failed + 1)
    again = h.publish(a=2.0)
    assert eventually(lambda: len(h.driver.launches) == 1)
    h.finish(again)
    assert patched_values(h) == [2.0]


def test_a_resume_forgets_what_each_launch_was_given(harness: Harness) -> None:
    """Python may give a launch other values while the ring is with it: after any resume the
    next record is patched, even with the value patched last."""
    h = harness
    masked_first_sight(h)
    fast = h.publish(a=6.0)
    h.finish(fast)
    slow = h.publish(n=9, a=6.0)  # another launch: Python's
    decide(h, slow)
    again = h.publish(a=6.0)
    assert eventually(lambda: len(h.driver.launches) == 2)
    h.finish(again)
    assert patched_values(h) == [6.0, 6.0]


def test_clearing_the_tickets_drops_the_free_specs(harness: Harness) -> None:
    h = harness
    masked_first_sight(h)
    unbind = h.publish(a=2.0)
    assert eventually(lambda: len(h.driver.launches) == 1)
    h.finish(unbind)
    assert eventually(lambda: h.client.done == unbind + 1)
    h.engine.resume(1, unbind + 1, clear=True)  # as after an UNBIND: handles may mean others
    later = h.publish(a=3.0)
    decide(h, later)
    assert len(h.driver.launches) == 1


def test_an_exact_ticket_is_not_found_through_a_free_spec_nor_a_masked_one_without(
    harness: Harness,
) -> None:
    """A record whose free field holds zeros has the masked key's bytes: it must still be
    patched (found through its handle's spec), never launched as an exact match."""
    h = harness
    masked_first_sight(h)
    zero = h.publish(a=0.0)
    assert eventually(lambda: len(h.driver.launches) == 1)
    h.finish(zero)
    assert patched_values(h) == [0.0]


@pytest.mark.parametrize(
    ("free", "why"),
    [
        ((0, bytes(8), (0,) * 8), "no field"),
        ((1 << 8, bytes(8), (0,) * 8), "field 8"),
        ((2, bytes([0, 3, 0, 0, 0, 0, 0, 0]), (0,) * 8), "width 3"),
        ((2, bytes([0, 2, 0, 0, 0, 0, 0, 0]), (0, F32_EXPONENT, 0, 0, 0, 0, 0, 0)), "bits past"),
        ((2, bytes([4, 4, 0, 0, 0, 0, 0, 0]), (0,) * 8), "width for a field not free"),
        ((2, bytes(7), (0,) * 8), "seven widths"),
        ((2, bytes([0, 4, 0, 0, 0, 0, 0, 0]), (0,) * 7), "seven exponents"),
    ],
)
def test_a_free_spec_that_does_not_hold_is_refused(
    harness: Harness, free: object, why: str
) -> None:
    h = harness
    first = h.publish(a=1.0)
    [_] = h.slow()
    with pytest.raises(ValueError):
        h.engine.resume(1, first + 1, [], [masked_ticket(h, first, free)])
    h.engine.resume(1, first + 1)


def test_a_masked_key_must_hold_zeros_where_it_is_free(harness: Harness) -> None:
    h = harness
    first = h.publish(a=1.0)
    [_] = h.slow()
    ticket = list(masked_ticket(h, first))
    ticket[0] = h.key(first)  # a = 1.0 left in
    with pytest.raises(ValueError, match="zeros in the key"):
        h.engine.resume(1, first + 1, [], [tuple(ticket)])
    h.engine.resume(1, first + 1)


def test_a_driver_that_gives_no_patch_takes_no_free_scalars() -> None:
    h = Harness(patches=False)
    try:
        first = h.publish(a=1.0)
        [_] = h.slow()
        with pytest.raises(ValueError, match="gives no patch"):
            h.engine.resume(1, first + 1, [], [masked_ticket(h, first)])
        h.engine.resume(1, first + 1)
    finally:
        h.close()


def test_more_free_specs_than_a_ring_keeps_leave_the_rest_to_python() -> None:
    """A ring keeps free specs for 32 session handles; a ticket past them is left out."""
    h = Harness(slots=128)
    try:
        scalars = struct.Struct("<I4xf4x48x")
        seqs = []
        for handle in range(1, 35):
            fixed = h.client.fixed_part(handle, [2], [3], 2)
            seq = h.client.launch_fixed(fixed, scalars, (4, 1.0), False, 1.0)
            seqs.append((handle, seq))
            decide(h, seq, masked_ticket(h, seq))
        for handle, _ in seqs:
            fixed = h.client.fixed_part(handle, [2], [3], 2)
            h.client.launch_fixed(fixed, scalars, (4, 7.0), False, 1.0)
        deadline = time.monotonic() + 5
        slow = 0
        while len(h.driver.launches) + slow < 34 and time.monotonic() < deadline:
            for item in h.engine.take_slow(0.05):
                slow += 1
                h.engine.resume(1, item[2] + 1, [(0, STREAM, TOKEN)])
        assert len(h.driver.launches) == 32 and slow == 2
    finally:
        h.close()


def test_a_handle_bound_anew_without_free_scalars_is_matched_exactly(harness: Harness) -> None:
    h = harness
    masked_first_sight(h)
    rebound = h.publish(a=2.0)
    assert eventually(lambda: len(h.driver.launches) == 1)
    h.finish(rebound)
    assert eventually(lambda: h.client.done == rebound + 1)
    h.engine.resume(1, rebound + 1, clear=True)  # the handle now names another session
    exact = h.publish(a=2.0)
    decide(h, exact, h.ticket(exact))
    again = h.publish(a=2.0)
    assert eventually(lambda: len(h.driver.launches) == 2)
    h.finish(again)
    assert patched_values(h) == [2.0]  # the exact ticket's launch was not patched
