"""The engine tests' shared fixture: a running ``Harness`` (one engine, a fake driver, a ring)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.engine.test_native_engine import Harness


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness()
    try:
        yield h
    finally:
        h.close()
