"""The polling event loop: answers at once when work is ready, sleeps as told, keeps timers."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from accyd.process.event_loop import SpinSelector, set_loop_spin, spinning_loop
from accyd.settings.config import CUDA_LOOP_SPIN_SECONDS, Config


def test_a_spinning_selector_returns_ready_work_at_once_and_sleeps_out_its_timeout() -> None:
    left, right = socket.socketpair()
    selector = SpinSelector(spin_seconds=0.002)
    try:
        selector.register(left, 1)  # EVENT_READ
        started = time.perf_counter()
        assert selector.select(0.05) == []
        assert 0.045 <= time.perf_counter() - started < 0.5  # spun 2 ms, then slept the rest
        right.send(b"x")
        started = time.perf_counter()
        ready = selector.select(None)
        assert [key.fileobj for key, _ in ready] == [left]
        assert time.perf_counter() - started < 0.05
        assert selector.select(0) != []  # a zero timeout only polls
    finally:
        selector.close()
        left.close()
        right.close()


def test_only_a_spinning_loop_takes_a_spin_and_its_timers_keep_time() -> None:
    plain = asyncio.new_event_loop()
    try:
        assert not set_loop_spin(plain, 0.001)
    finally:
        plain.close()
    loop = spinning_loop()
    try:
        assert set_loop_spin(loop, 0.0005)

        async def timed() -> float:
            started = time.perf_counter()
            await asyncio.sleep(0.02)
            return time.perf_counter() - started

        assert 0.019 <= loop.run_until_complete(timed()) < 0.2
    finally:
        loop.close()


def test_loop_spin_setting_reads_from_the_environment_and_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Unset, it goes by backend: polling on CUDA, off where kernels need the CPU.
    assert Config().loop_spin_for("cuda") == CUDA_LOOP_SPIN_SECONDS > 0
    assert Config().loop_spin_for("host") == 0.0
    assert Config().loop_spin_for("mixed") == 0.0
    monkeypatch.setenv("ACCYD_LOOP_SPIN_SECONDS", "0.0002")
    assert Config.from_env().loop_spin_for("host") == 0.0002
    monkeypatch.setenv("ACCYD_LOOP_SPIN_SECONDS", "0")
    assert Config.from_env().loop_spin_for("cuda") == 0.0  # an operator can turn it off
    monkeypatch.setenv("ACCYD_LOOP_SPIN_SECONDS", "auto")
    assert Config.from_env().loop_spin_seconds is None
    with pytest.raises(ValueError, match="loop_spin_seconds"):
        Config(loop_spin_seconds=1.0).validate()
