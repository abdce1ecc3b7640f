"""The supervisor: runs the server in a child process and restarts it when it dies.

A sticky CUDA error poisons the process that owns the context, so recovery is a
new process. The server exits with ``EXIT_DEVICE_LOST`` after a device fault;
any other non-zero exit or death by signal of a server that had served is
restarted after a back-off that doubles from ``backoff_initial`` up to
``backoff_max``, until more than ``max_restarts`` restarts fall within
``window_seconds``. A server that never became ready (``EXIT_NEVER_READY``: a
manifest typo, a busy port) would fail the same way again, and one that stopped
because it was asked to (``EXIT_STOPPED_BUSY``) should stay stopped: neither is
restarted. ``stop`` passes a signal to the child and ends the restarting;
``kill`` forces the child; the caller installs the signal handlers
(``accyd.process.signals``).
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

import structlog

from accyd.process.exits import EXIT_DEVICE_LOST, EXIT_NEVER_READY, EXIT_STOPPED_BUSY, Lineage

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
        self.forced = False
        """Whether ``kill`` ended the child."""
        self._log = structlog.get_logger("accyd.process.supervisor")

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Stop restarting and pass ``signum`` to the running child."""
        self._stop.set()
        child = self._child
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    def kill(self, signum: int = signal.SIGTERM) -> None:
        """Stop restarting and kill the running child (a stop that must not wait)."""
        self.forced = True
        self.stop(signal.SIGKILL)

    def forward(self, signum: int) -> None:
        """Pass ``signum`` (SIGHUP: reload) to the running child."""
        child = self._child
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    def run(self) -> int:
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
                return 0 if code < 0 and self._stop.is_set() and not self.forced else code
            if code in (EXIT_NEVER_READY, EXIT_STOPPED_BUSY):
                # Its own last log line says why; a restart would not help.
                self._log.info("supervisor.exit", code=code, restarted=False)
                return code
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
