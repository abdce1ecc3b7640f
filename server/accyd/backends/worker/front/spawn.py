"""Starting a device worker process: its command line, environment and channel.

The front keeps one end of a ``socketpair``; the child
inherits the other end's descriptor (``pass_fds``, nothing else) and finds its
number in ``--fd``. The front closes its copy of the child's end at once, so the
channel reaches end-of-file when the child dies, and the child's end reaches it
when the front dies: neither can outlive the other unnoticed.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import accy.protocol as protocol
import accyd

__all__ = ["WorkerCommand", "spawn_worker"]


@dataclass(frozen=True, slots=True)
class WorkerCommand:
    """What one worker runs: the backend it makes and how it logs."""

    kind: str
    """``cuda`` or ``host`` (``auto`` is resolved by the front first)."""
    device: int = 0
    cache_dir: Path | None = None
    host_memory_limit: int | None = None
    log_format: str = "console"
    log_level: str = "info"

    def argv(self, fd: int, lane: int) -> list[str]:
        argv = [
            sys.executable,
            "-m",
            "accyd.backends.worker.child.main",
            "--backend",
            self.kind,
            "--device",
            str(self.device),
            "--fd",
            str(fd),
            "--lane",
            str(lane),
            "--log-format",
            self.log_format,
            "--log-level",
            self.log_level,
        ]
        if self.cache_dir is not None:
            argv += ["--cache-dir", str(self.cache_dir)]
        if self.host_memory_limit is not None:
            argv += ["--host-memory-limit", str(self.host_memory_limit)]
        return argv


def _environment() -> dict[str, str]:
    """This process's environment, with the packages it imported first on the path
    (a daemon run from a source tree finds the same code in its workers)."""
    env = dict(os.environ)
    roots = []
    for module, depth in ((accyd, 1), (protocol, 2)):  # accyd/__init__, accy/protocol/__init__
        root = str(Path(module.__file__ or ".").resolve().parents[depth])
        if root not in roots:
            roots.append(root)
    existing = env.get("PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join([*roots, *([existing] if existing else [])])
    return env


def spawn_worker(
    command: WorkerCommand,
) -> tuple[subprocess.Popen[bytes], socket.socket, socket.socket]:
    """Start the worker ``command`` describes; its channel, not yet ready (it sends ``READY``),
    and its lane (descriptors the worker hands over, ``SCM_RIGHTS`` only).

    The caller owns all three: it reaps the process and closes the sockets."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    lane, their_lane = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        process = subprocess.Popen(
            command.argv(theirs.fileno(), their_lane.fileno()),
            pass_fds=(theirs.fileno(), their_lane.fileno()),
            stdin=subprocess.DEVNULL,
            env=_environment(),
        )
    except BaseException:
        ours.close()
        lane.close()
        raise
    finally:
        theirs.close()
        their_lane.close()
    return process, ours, lane
