"""Tickets: a launch the core checked once, offered to an engine, and revoked by every event
that can make it stale (``core/tickets.py``, the invalidation table in the architecture map).

A fake engine stands behind the core here: it records what the core revokes, so each
rule is seen from the core's side, whatever engine takes the tickets.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator

import numpy as np
import pytest

from accyd.catalog.dtypes import DType, Scalar
from accyd.core.clients import Client
from accyd.core.daemon import Daemon, WouldBlock
from accyd.core.device import DeviceHealth
from accyd.core.tickets import FastLaunch
from tests.core.daemon_fixtures import host_daemon

SAXPY = "accy.kernel.saxpy"
SCAN = "accy.kernel.device_scan"
N = 256
SAXPY_ARGS = {"n": Scalar.u32(N), "a": Scalar.f32(2.0)}


class FakeEngine:
    """Epoch slots and counters as an engine keeps them; revocations recorded."""

    ticketing = True

    def __init__(self) -> None:
        self.values: list[int] = []
        self.revoked: list[int] = []
        self.freed: list[int] = []
        self.quiesced = 0

    def new_epoch(self) -> int | None:
        self.values.append(0)
        return len(self.values) - 1

    def epoch_value(self, epoch: int) -> int:
        return self.values[epoch]

    def revoke(self, epochs: Collection[int]) -> None:
        for epoch in epochs:
            self.values[epoch] += 1
            self.revoked.append(epoch)
        self.quiesce()

    def free_epoch(self, epoch: int) -> None:
        self.freed.append(epoch)

    def quiesce(self) -> None:
        self.quiesced += 1

    def in_flight(self, client: Client) -> tuple[int, int]:
        return 0, 0

    def published(self, client: Client) -> None:
        return None

    def launched(self) -> int:
        return 0

    def valid(self, fast: FastLaunch | None) -> bool:
        assert fast is not None
        return self.values[fast.epoch] == fast.value


@pytest.fixture
def core() -> Iterator[tuple[Daemon, FakeEngine]]:
    daemon, _ = host_daemon()
    engine = FakeEngine()
    watched: list[DeviceHealth] = []
    daemon.attach_engine(engine, engine, watched.append)
    try:
        yield daemon, engine
    finally:
        daemon.close()


def saxpy(daemon: Daemon) -> tuple[str, str, str, str]:
    client = daemon.attach("t").id
    session = daemon.load_pipeline(client, SAXPY).session_id
    x = daemon.allocate_buffer(client, 4 * N, DType.F32).id
    y = daemon.allocate_buffer(client, 4 * N, DType.F32).id
    return client, session, x, y


def test_a_launch_on_the_sessions_own_scratch_comes_back_as_a_ticket(
    core: tuple[Daemon, FakeEngine],
) -> None:
    daemon, engine = core
    client, session, x, y = saxpy(daemon)
    plain = daemon.launch(client, session, [x, y], [y], SAXPY_ARGS)
    assert plain.fast is None  # only for a door that asks for one
    ticket = daemon.launch(client, session, [x, y], [y], SAXPY_ARGS, ticket_for="ring")
    assert engine.valid(ticket.fast)
    assert ticket.fast is not None and ticket.fast.session_id == session
    scan = daemon.load_pipeline(client, SCAN).session_id
    big = daemon.allocate_buffer(client, 4 * 5000, DType.F32).id
    with pytest.raises(WouldBlock):  # no scratch of its own yet: never a ticket
        daemon.launch(client, scan, [big], [big], {"n": Scalar.u32(5000)}, ticket_for="ring")


def test_replaced_scratch_a_freed_buffer_and_a_release_revoke_it(
    core: tuple[Daemon, FakeEngine],
) -> None:
    daemon, engine = core
    client = daemon.attach("t").id
    session = daemon.load_pipeline(client, SCAN).session_id
    x = daemon.allocate_buffer(client, 4 * 5000, DType.F32).id
    y = daemon.allocate_buffer(client, 4 * 5000, DType.F32).id
    other = daemon.allocate_buffer(client, 64).id
    n = {"n": Scalar.u32(5000)}
    daemon.allocate_intermediates(client, session, n)
    first = daemon.launch(client, session, [x], [y], n, ticket_for="ring").fast
    daemon.allocate_intermediates(client, session, {"n": Scalar.u32(50000)})  # new scratch
    assert not engine.valid(first)
    second = daemon.launch(client, session, [x], [y], n, ticket_for="ring").fast
    assert engine.valid(second)
    daemon.free_buffer(client, other)  # not one it names: it stays good
    assert engine.valid(second)
    daemon.free_buffer(client, x)
    assert not engine.valid(second)
    y2 = daemon.allocate_buffer(client, 4 * 5000, DType.F32).id
    third = daemon.launch(client, session, [y], [y2], n, ticket_for="ring").fast
    daemon.release(client, session)
    assert not engine.valid(third)
    assert third is not None and third.epoch in engine.freed  # its slot came back


def test_a_graph_is_prepared_once_and_launched_by_one_thread(
    core: tuple[Daemon, FakeEngine],
) -> None:
    daemon, engine = core
    backend = daemon.backends[0]
    prepares: list[int] = []
    prepare = backend.prepare

    def counting(requests: object) -> object:
        prepares.append(1)
        return prepare(requests)  # type: ignore[arg-type]

    backend.prepare = counting  # type: ignore[method-assign]
    client, session, x, y = saxpy(daemon)
    daemon.open_write(client, x).write(0, np.ones(N, np.float32).tobytes())
    fast = daemon.launch(client, session, [x, y], [y], SAXPY_ARGS, ticket_for="ring").fast
    for _ in range(4):  # the same launch again, ticketed by the same ring: still good
        again = daemon.launch(client, session, [x, y], [y], SAXPY_ARGS, ticket_for="ring").fast
        assert again is not None and fast is not None and again.launch is fast.launch
    assert len(prepares) == 1
    daemon.launch(client, session, [x, y], [y], SAXPY_ARGS)  # Python launches it itself:
    assert fast is not None and not engine.valid(again)  # the ring's ticket goes first
    daemon.wait_launch(client, session)
    got = np.frombuffer(daemon.open_read(client, y).read(0, 4 * N), np.float32)
    assert np.all(got == 12.0)  # six launches of y = 2 * 1 + y


def test_another_session_that_conflicts_on_a_buffer_revokes_the_ticket(
    core: tuple[Daemon, FakeEngine],
) -> None:
    daemon, engine = core
    client, session, x, y = saxpy(daemon)
    other = daemon.load_pipeline(client, "accy.kernel.reduce_sum").session_id
    total = daemon.allocate_buffer(client, 4, DType.F32).id
    fast = daemon.launch(client, session, [x, y], [y], SAXPY_ARGS, ticket_for="ring").fast
    record = daemon._t.clients.get(client).buffers[y]
    assert record.ticketed and record.engine  # the ticket writes y
    daemon.allocate_intermediates(client, other, {"n": Scalar.u32(N)})
    daemon.launch(client, other, [x], [total], {"n": Scalar.u32(N)})  # reads x only: no conflict
    assert engine.valid(fast)
    daemon.launch(client, other, [y], [total], {"n": Scalar.u32(N)})  # reads what it writes
    assert not engine.valid(fast)
    assert not record.ticketed  # and its launches so far were absorbed into y's hazards
    assert record.last_write is not None


def test_an_engine_touched_session_waits_on_its_stream_itself(
    core: tuple[Daemon, FakeEngine],
) -> None:
    daemon, _ = core
    client, session, x, y = saxpy(daemon)
    daemon.launch(client, session, [x, y], [y], SAXPY_ARGS, ticket_for="ring")
    daemon.wait_launch(client, session)  # reaped: nothing left in the session's log
    loaded = daemon._t.clients.get(client).sessions[session]
    assert loaded.launches_in_flight == 0
    mark = loaded.pending(None)  # yet the engine may have launched on its stream since
    assert mark is not None
    mark.release()
