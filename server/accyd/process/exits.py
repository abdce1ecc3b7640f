"""What a server process and its supervisor tell each other: exit statuses and the lineage."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "EXIT_DEVICE_LOST",
    "EXIT_FORCED",
    "EXIT_NEVER_READY",
    "EXIT_STOPPED_BUSY",
    "Lineage",
]

EXIT_DEVICE_LOST = 75
"""The server's exit code after a sticky device fault (EX_TEMPFAIL: try again)."""
EXIT_FORCED = 1
"""A stop forced by a second signal."""
EXIT_STOPPED_BUSY = 74
"""A stop that was asked for, with the device still busy at the end of the grace: the
work not yet done was dropped. Not restarted."""
EXIT_NEVER_READY = 78
"""The server failed before it served (EX_CONFIG): a restart would fail the same way."""

_PID_ENV = "ACCYD_SUPERVISOR_PID"
_RESTARTS_ENV = "ACCYD_SUPERVISOR_RESTARTS"
_DEVICE_FAULTS_ENV = "ACCYD_SUPERVISOR_DEVICE_FAULTS"


@dataclass(frozen=True, slots=True)
class Lineage:
    """What came before this server process, as its supervisor tells it through the environment."""

    supervisor_pid: int | None = None
    restarts: int = 0
    device_faults: int = 0

    def environment(self) -> dict[str, str]:
        return {
            _PID_ENV: str(self.supervisor_pid or ""),
            _RESTARTS_ENV: str(self.restarts),
            _DEVICE_FAULTS_ENV: str(self.device_faults),
        }

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Lineage:
        """The lineage a supervisor passed down; an unsupervised process has none."""
        env = os.environ if environ is None else environ
        try:
            return cls(
                int(env[_PID_ENV]) if env.get(_PID_ENV) else None,
                int(env.get(_RESTARTS_ENV) or 0),
                int(env.get(_DEVICE_FAULTS_ENV) or 0),
            )
        except ValueError:
            return cls()
