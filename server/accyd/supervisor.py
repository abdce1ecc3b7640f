"""The supervisor: runs the server in a child process and restarts it when it dies.

A sticky CUDA error poisons the process that owns the context, so recovery is a
new process. The server exits with ``EXIT_DEVICE_LOST`` after a device fault;
any non-zero exit or death by signal is restarted after a back-off that doubles
from ``backoff_initial`` up to ``backoff_max``, until more than ``max_restarts``
restarts fall within ``window_seconds``. SIGTERM and SIGINT are passed to the
child and stop the restarting; the supervisor then exits with the child's code.
Each child finds in its environment how many restarts and device faults came
before it (``Lineage``), so its metrics can count them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType

import structlog

from accyd.lineage import EXIT_DEVICE_LOST, Lineage

__all__ = ["EXIT_DEVICE_LOST", "RestartPolicy", "Supervisor"]


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    max_restarts: int = 10
    window_seconds: float = 300.0
    backoff_initial: float = 0.05
    backoff_max: float = 5.0
    stable_after_seconds: float = 30.0
    """A child that ran this long resets the back-off to ``backoff_initial``."""


class Supervisor:
    """Runs ``command`` until it exits 0, is stopped by a signal, or fails too often."""

    def __init__(
        self,
        command: Sequence[str],
        policy: RestartPolicy = RestartPolicy(),
        *,
        on_start: Callable[[int], None] | None = None,
    ) -> None:
        self.command = list(command)
        self.policy = policy
        self.restarts = 0
        self.device_faults = 0
        self._on_start = on_start
        self._stop = threading.Event()
        self._child: subprocess.Popen[bytes] | None = None
        self._log = structlog.get_logger("accyd.supervisor")

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Stop restarting and pass ``signum`` to the running child."""
        self._stop.set()
        child = self._child
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._log.info("supervisor.signal", signal=signal.Signals(signum).name)
        self.stop(signum)

    def run(self, *, install_signal_handlers: bool = True) -> int:
        if install_signal_handlers:
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, self._handle)
        recent: deque[float] = deque()
        backoff = self.policy.backoff_initial
        while True:
            started = time.monotonic()
            lineage = Lineage(os.getpid(), self.restarts, self.device_faults)
            self._child = subprocess.Popen(
                self.command, env={**os.environ, **lineage.environment()}
            )
            # The first start is the server's own news: its first log line names the backend
            # it picked and where it listens. Restarts are the supervisor's to report.
            log = self._log.info if self.restarts else self._log.debug
            log("supervisor.started", pid=self._child.pid, restarts=self.restarts)
            if self._on_start is not None:
                self._on_start(self._child.pid)
            code = self._child.wait()
            ran = time.monotonic() - started
            if code == EXIT_DEVICE_LOST:
                self.device_faults += 1
            if self._stop.is_set() or code == 0:
                self._log.info("supervisor.exit", code=code)
                return 0 if code < 0 and self._stop.is_set() else code
            now = time.monotonic()
            while recent and now - recent[0] > self.policy.window_seconds:
                recent.popleft()
            if len(recent) >= self.policy.max_restarts:
                self._log.error(
                    "supervisor.giving_up",
                    code=code,
                    restarts=len(recent),
                    window_seconds=self.policy.window_seconds,
                )
                return code if code > 0 else 128 - code
            if ran >= self.policy.stable_after_seconds:
                backoff = self.policy.backoff_initial
            reason = "device_lost" if code == EXIT_DEVICE_LOST else "crashed"
            self._log.warning("supervisor.restarting", code=code, reason=reason, backoff=backoff)
            if self._stop.wait(backoff):
                return code
            recent.append(time.monotonic())
            self.restarts += 1
            backoff = min(self.policy.backoff_max, backoff * 2)
