"""FP16, BF16, INT8, INT16, UINT16, BOOL and real dims through the KServe door, as a
tritonclient user sends them (``programs/user_types.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from accy.testing import RunningDaemon, running_daemon
from tests.kserve.harness import Tools, run_program, url_of

CATALOG = Path(__file__).parents[1] / "catalogs" / "host_dtypes"


@pytest.fixture(scope="module")
def daemon() -> Iterator[RunningDaemon]:
    extra = ["--no-supervise", "--catalog", str(CATALOG)]
    with running_daemon(backend="host", extra=extra) as running:
        yield running


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_user_types_through_tritonclient(
    tools: Tools, daemon: RunningDaemon, transport: str
) -> None:
    done = run_program(tools, "user_types", url_of(daemon, transport), None)
    assert "PASS: user types" in done.stdout
