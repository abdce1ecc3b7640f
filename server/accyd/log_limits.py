"""Log lines bounded per client: a client that makes the daemon log per request floods nothing.

Every line that names a client (``client_id``: a refused call, a refused ring
record, a segment opened), or a peer that is not a client yet (``peer``: a
connection to the handoff socket), counts against it: at most ``lines`` per
``period`` seconds are written, and at most ``total`` of all clients' lines
together. Past that, lines are counted, not written, and once the period is
over one summary line per client says how many of which lines were left out
(``log lines left out``, a warning). Lines that name no client pass as they
are: the daemon's own news is never dropped.

It runs as a structlog processor (``configure_logging`` installs it after the
call's ids are added), so every call site is covered without asking for it.
A line left out costs the processors before this one and a dictionary
lookup, not its rendering or its write.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

__all__ = ["CLIENT_LINES", "TOTAL_LINES", "ClientLines"]

CLIENT_LINES = 20
"""Lines one client may have the daemon write per period (a second)."""
TOTAL_LINES = 400
"""Lines all clients together may have the daemon write per period."""
_MOST_EVENTS = 4
"""Kinds of lines a summary names, the most frequent first."""
_MOST_CLIENTS = 16
"""Clients summarized one by one in a period; past that, in one line."""

_summarizing: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "accyd_log_summary", default=False
)


@dataclass(slots=True)
class _Window:
    started: float
    written: int = 0
    left_out: Counter[str] = field(default_factory=Counter)


def _emit_summary(**fields: object) -> None:
    token = _summarizing.set(True)
    try:
        structlog.get_logger("accyd.logs").warning("log lines left out", **fields)
    finally:
        _summarizing.reset(token)


class ClientLines:
    """The processor: counts each client's lines per period and drops those over the limit.

    Thread-safe (lines come from the event loop, the device-work threads and the
    ring submitter at once). Windows of clients with nothing left out are
    dropped when their period ends, so the table holds only recent clients.
    """

    def __init__(
        self,
        lines: int = CLIENT_LINES,
        period: float = 1.0,
        total: int = TOTAL_LINES,
        *,
        clock: Callable[[], float] = time.monotonic,
        emit: Callable[..., None] = _emit_summary,
    ) -> None:
        self.lines = lines
        self.period = period
        self.total = total
        self._clock = clock
        self._emit = emit
        self._lock = threading.Lock()
        self._windows: dict[str, _Window] = {}
        self._period_start = clock()
        self._written = 0
        self.left_out = 0
        """Lines left out so far, over all clients (for tests and status)."""

    def __call__(
        self, logger: object, method: str, event: structlog.typing.EventDict
    ) -> structlog.typing.EventDict:
        if _summarizing.get():
            return event
        client = event.get("client_id") or event.get("peer")
        now = self._clock()
        with self._lock:
            due = self._roll(now)
            if not client:
                keep = True
            else:
                keep = self._count(str(client), str(event.get("event", "")), now)
        self._say(due)
        if not keep:
            raise structlog.DropEvent
        return event

    def _count(self, client: str, what: str, now: float) -> bool:
        """Under the lock: count one line of ``client``; whether it is written."""
        window = self._windows.get(client)
        if window is None:
            window = self._windows[client] = _Window(now)
        if window.written < self.lines and self._written < self.total:
            window.written += 1
            self._written += 1
            return True
        window.left_out[what] += 1
        self.left_out += 1
        return False

    def _roll(self, now: float) -> list[tuple[str, _Window]]:
        """Under the lock: end the period if it is over; the windows to summarize."""
        if now - self._period_start < self.period:
            return []
        self._period_start = now
        self._written = 0
        ended, self._windows = self._windows, {}
        return [(client, window) for client, window in ended.items() if window.left_out]

    def flush(self) -> None:
        """Summarize what is left out so far (at shutdown, or in a test)."""
        with self._lock:
            self._period_start = self._clock() - self.period
            due = self._roll(self._clock())
        self._say(due)

    def _say(self, due: list[tuple[str, _Window]]) -> None:
        if not due:
            return
        due.sort(key=lambda item: -sum(item[1].left_out.values()))
        for client, window in due[:_MOST_CLIENTS]:
            self._emit(
                client_id=client,
                left_out=sum(window.left_out.values()),
                lines={name: n for name, n in window.left_out.most_common(_MOST_EVENTS)},
                seconds=round(self._clock() - window.started, 3),
                limit=f"{self.lines} lines per client per {self.period:g} s",
            )
        rest = due[_MOST_CLIENTS:]
        if rest:
            self._emit(
                clients=len(rest),
                left_out=sum(sum(window.left_out.values()) for _, window in rest),
                limit=f"{self.lines} lines per client per {self.period:g} s",
            )
