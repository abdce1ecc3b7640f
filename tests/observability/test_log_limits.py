"""Log lines bounded per client (``ClientLines``): counted per period, the rest summarized."""

from __future__ import annotations

import structlog

from accyd.log_limits import ClientLines


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def feed(limit: ClientLines, client: str | None, event: str = "refused") -> bool:
    """Whether ``limit`` lets one line of ``client`` through."""
    try:
        limit(None, "info", {"event": event, **({"client_id": client} if client else {})})
    except structlog.DropEvent:
        return False
    return True


def test_a_client_past_its_lines_is_left_out_then_summarized_once_the_period_ends() -> None:
    clock, said = Clock(), []
    limit = ClientLines(3, 1.0, 100, clock=clock, emit=lambda **fields: said.append(fields))
    assert [feed(limit, "alice") for _ in range(5)] == [True, True, True, False, False]
    assert feed(limit, "bob"), "another client has lines of its own"
    assert feed(limit, None), "the daemon's own lines are never left out"
    assert said == []
    clock.now += 1.5
    assert feed(limit, "alice"), "a new period"
    assert len(said) == 1
    assert said[0]["client_id"] == "alice"
    assert said[0]["left_out"] == 2
    assert said[0]["lines"] == {"refused": 2}


def test_all_clients_together_are_bounded_and_flush_says_what_was_left_out() -> None:
    clock, said = Clock(), []
    limit = ClientLines(5, 1.0, 8, clock=clock, emit=lambda **fields: said.append(fields))
    written = sum(feed(limit, f"client-{i}") for i in range(20))
    assert written == 8
    limit.flush()
    assert sum(fields["left_out"] for fields in said) == 12
