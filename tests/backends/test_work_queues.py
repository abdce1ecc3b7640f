"""CUDA's work queues per context: set before any backend is made, an operator's value kept."""

from __future__ import annotations

from typing import Any

import pytest

from accyd import devices
from accyd.backends.base import Backend
from accyd.backends.queues import DEFAULT_QUEUES, MAX_CONNECTIONS_ENV, set_work_queues
from accyd.backends.worker.child import main as worker_main
from accyd.settings.config import Config
from accyd.testing import RecordingBackend


class Made(Exception):
    """Raised by the stand-in backend factory once it saw the environment (ends a worker)."""


def recording_factory(seen: list[str | None]) -> Any:
    import os

    def make(kind: str = "auto", **options: Any) -> Backend:
        seen.append(os.environ.get(MAX_CONNECTIONS_ENV))
        return RecordingBackend()

    return make


def test_the_daemon_sets_the_queues_before_it_makes_a_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(MAX_CONNECTIONS_ENV, raising=False)
    seen: list[str | None] = []
    monkeypatch.setattr(devices, "make_backend", recording_factory(seen))
    backends, pool = devices.open_backends(
        Config(devices=(0, 1), device_workers=False), lambda *_: None
    )
    assert pool is None and len(backends) == 2
    assert seen == [str(DEFAULT_QUEUES)] * 2  # in the environment while each backend was made


def test_the_flag_sets_another_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MAX_CONNECTIONS_ENV, raising=False)
    seen: list[str | None] = []
    monkeypatch.setattr(devices, "make_backend", recording_factory(seen))
    devices.open_backends(Config(cuda_max_connections=12), lambda *_: None)
    assert seen == ["12"]


def test_an_operators_own_value_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MAX_CONNECTIONS_ENV, "4")
    seen: list[str | None] = []
    monkeypatch.setattr(devices, "make_backend", recording_factory(seen))
    devices.open_backends(Config(), lambda *_: None)
    assert seen == ["4"]
    assert set_work_queues(32) == ("4", True)


def test_set_work_queues_on_a_given_environment() -> None:
    env: dict[str, str] = {}
    assert set_work_queues(8, env) == ("8", False) and env == {MAX_CONNECTIONS_ENV: "8"}
    assert set_work_queues(32, {MAX_CONNECTIONS_ENV: " "}) == ("32", False)  # blank: unset


def test_a_device_worker_sets_them_before_its_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import socket

    monkeypatch.delenv(MAX_CONNECTIONS_ENV, raising=False)
    seen: list[str | None] = []

    def make(kind: str = "auto", **options: Any) -> Backend:
        seen.append(os.environ.get(MAX_CONNECTIONS_ENV))
        raise Made

    monkeypatch.setattr(worker_main, "make_backend", make)
    monkeypatch.setattr(worker_main, "_log_as_device", lambda *_: None)
    monkeypatch.setattr(worker_main.signal, "signal", lambda *_: None)  # keep pytest's
    ours, theirs = socket.socketpair()

    def fatal(self: object, error: BaseException, status: int = 0) -> None:
        raise error

    monkeypatch.setattr(worker_main._Channel, "fatal", fatal)
    try:
        with pytest.raises(Made):
            worker_main.main(["--backend", "host", "--fd", str(theirs.detach())])
    finally:
        ours.close()
    assert seen == [str(DEFAULT_QUEUES)]


@pytest.mark.parametrize("count", [0, 33])
def test_out_of_range_counts_are_refused(count: int) -> None:
    with pytest.raises(ValueError, match="cuda_max_connections is 1 to 32"):
        Config(cuda_max_connections=count).validate()
