"""The supervisor restarts a dying server with back-off, gives up when it fails too often."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from accyd.process.supervisor import EXIT_DEVICE_LOST, RestartPolicy, Supervisor

FAST = RestartPolicy(max_restarts=3, window_seconds=60, backoff_initial=0.01, backoff_max=0.02)


def child(tmp_path: Path, body: str) -> list[str]:
    script = tmp_path / "child.py"
    script.write_text(
        "import pathlib, sys, time, signal\n"
        f"runs = pathlib.Path({str(tmp_path / 'runs')!r})\n"
        "count = int(runs.read_text()) + 1 if runs.exists() else 1\n"
        "runs.write_text(str(count))\n" + body
    )
    return [sys.executable, str(script)]


def runs(tmp_path: Path) -> int:
    return int((tmp_path / "runs").read_text())


def test_restarts_after_device_lost_until_the_child_exits_cleanly(tmp_path: Path) -> None:
    command = child(tmp_path, f"sys.exit({EXIT_DEVICE_LOST} if count < 3 else 0)\n")
    supervisor = Supervisor(command, FAST)
    assert supervisor.run() == 0
    assert runs(tmp_path) == 3
    assert supervisor.restarts == 2


def test_restarts_a_child_killed_by_a_signal(tmp_path: Path) -> None:
    command = child(tmp_path, "import os\nif count < 2: os.kill(os.getpid(), signal.SIGKILL)\n")
    supervisor = Supervisor(command, FAST)
    assert supervisor.run() == 0
    assert runs(tmp_path) == 2


def test_gives_up_after_too_many_restarts_in_the_window(tmp_path: Path) -> None:
    command = child(tmp_path, "sys.exit(3)\n")
    supervisor = Supervisor(command, FAST)
    assert supervisor.run() == 3
    assert runs(tmp_path) == FAST.max_restarts + 1


def test_stop_passes_the_signal_and_does_not_restart(tmp_path: Path) -> None:
    started = threading.Event()
    command = child(
        tmp_path,
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
        "print('ready', flush=True)\ntime.sleep(30)\nsys.exit(9)\n",
    )
    supervisor = Supervisor(command, FAST, on_start=lambda pid: started.set())
    timer = threading.Timer(0.0, lambda: (started.wait(5), time.sleep(0.3), supervisor.stop()))
    timer.start()
    began = time.monotonic()
    assert supervisor.run() == 0
    assert time.monotonic() - began < 10
    assert runs(tmp_path) == 1
    assert supervisor.restarts == 0
