"""The worker's event watcher: a callback once its event is over, never before, and events
destroyed only once nobody watches them."""

from __future__ import annotations

import threading
import time

import pytest

from accyd.backends.base import Event
from accyd.backends.worker.child.watch import EventWatcher
from accyd.errors import LaunchFailed


class Events:
    """A backend's event half, driven by the test: which events are over, which fail."""

    def __init__(self) -> None:
        self.over: set[int] = set()
        self.failed: set[int] = set()
        self.destroyed: list[int] = []
        self.queries = 0

    def event_done(self, event: Event) -> bool:
        self.queries += 1
        if event.id in self.failed:
            raise LaunchFailed(f"event {event.id}: its work failed")
        return event.id in self.over

    def destroy_event(self, event: Event) -> None:
        self.destroyed.append(event.id)


def eventually(condition: object, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.001)
    return False


@pytest.mark.parametrize("spin", [True, False])
def test_callbacks_come_once_their_event_is_over_and_not_before(spin: bool) -> None:
    events = Events()
    watcher = EventWatcher(events, spin=spin)  # type: ignore[arg-type]
    called: list[str] = []
    try:
        first, second = Event(1), Event(2)
        watcher.watch(first, lambda: called.append("first"), lambda: called.append("x"))
        watcher.watch(second, lambda: called.append("second"), lambda: called.append("y"))
        assert eventually(lambda: events.queries > 20)
        assert called == []  # polled many times, nothing over yet
        events.over.add(2)
        assert eventually(lambda: called == ["second"])
        events.over.add(1)
        assert eventually(lambda: called == ["second", "first"])
        time.sleep(0.02)
        assert called == ["second", "first"]  # each once
    finally:
        watcher.close()


def test_an_event_that_cannot_be_queried_goes_to_otherwise() -> None:
    events = Events()
    watcher = EventWatcher(events, spin=False)  # type: ignore[arg-type]
    called: list[str] = []
    try:
        events.failed.add(3)
        watcher.watch(Event(3), lambda: called.append("done"), lambda: called.append("otherwise"))
        assert eventually(lambda: called == ["otherwise"])
    finally:
        watcher.close()


def test_a_watched_event_is_destroyed_only_once_its_watch_ends() -> None:
    events = Events()
    watcher = EventWatcher(events, spin=False)  # type: ignore[arg-type]
    done = threading.Event()
    try:
        watched, free = Event(4), Event(5)
        watcher.watch(watched, done.set, done.set)
        watcher.destroy(free)
        watcher.destroy(watched)
        assert events.destroyed == [5]  # the unwatched one at once
        events.over.add(4)
        assert done.wait(5)
        assert eventually(lambda: events.destroyed == [5, 4])
    finally:
        watcher.close()
