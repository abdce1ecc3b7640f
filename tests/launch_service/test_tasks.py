"""TaskSet: side tasks kept until done, and a settle that always lets the loop run."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any

import pytest

from accyd.doors.grpc.tasks import TaskSet


def run_briefly(work: Coroutine[Any, Any, None], seconds: float = 10.0) -> None:
    """Run ``work`` on a loop of its own in a thread; fail if it has not ended in time.

    A loop that never yields cannot be timed out from inside it.
    """
    failures: list[BaseException] = []

    def main() -> None:
        try:
            asyncio.run(work)
        except BaseException as error:  # reported on the test's thread
            failures.append(error)

    runner = threading.Thread(target=main, daemon=True)
    runner.start()
    runner.join(timeout=seconds)
    assert not runner.is_alive(), "the event loop did not finish (spinning without yielding?)"
    if failures:
        raise failures[0]


async def nothing() -> None:
    return None


def test_settle_yields_to_a_done_task_whose_callback_is_still_queued() -> None:
    # From Python 3.12 on, gathering done tasks returns without yielding: waiting until
    # the set is empty that way never runs the callback that empties it.
    async def scenario() -> None:
        tasks = TaskSet()
        task = tasks.start(nothing())
        await asyncio.sleep(0)  # the task ran (first in line) and is done; its callback is not
        assert task.done() and len(tasks) == 1
        await tasks.settle()

    run_briefly(scenario())


def test_settle_waits_for_tasks_started_while_it_waits() -> None:
    async def scenario() -> None:
        tasks = TaskSet()
        finished: list[str] = []

        async def second() -> None:
            await asyncio.sleep(0.02)
            finished.append("second")

        async def first() -> None:
            await asyncio.sleep(0.01)
            tasks.start(second())
            finished.append("first")

        tasks.start(first())
        await tasks.settle()
        assert finished == ["first", "second"]
        await asyncio.sleep(0)
        assert len(tasks) == 0

    run_briefly(scenario())


def test_a_failed_task_is_its_own_business_and_cancel_stops_the_rest() -> None:
    async def scenario() -> None:
        tasks = TaskSet()

        async def fails() -> None:
            raise ValueError("its own")

        failing = tasks.start(fails())
        await tasks.settle()
        with pytest.raises(ValueError, match="its own"):
            failing.result()
        waiting = tasks.start(asyncio.sleep(60))
        tasks.cancel()
        await tasks.settle()
        assert waiting.cancelled()

    run_briefly(scenario())
