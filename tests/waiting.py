"""Waiting in tests for something another thread or process does: a bounded poll."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["eventually"]


def eventually(check: Callable[[], bool], timeout: float = 5.0, step: float = 0.001) -> bool:
    """Whether ``check()`` came true within ``timeout`` seconds (polled every ``step``)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(step)
    return True
