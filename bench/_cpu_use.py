"""Where the CPUs went while a series ran: the machine's busy CPUs and one process's, by thread.

``CpuUse(pid)`` is started as the workers are released and stopped when the first result
comes back (``run_workers(window=...)``); ``found`` then holds CPUs busy on average over
the window (CPU-seconds per second): the whole machine, the process with its descendants
(a supervisor's server), and their threads grouped by name (the native engine names its
threads ``accy-engine``). With
``perf_to`` and ``perf`` on the PATH, ``perf record -g`` samples the process meanwhile.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")


def _machine() -> tuple[int, int]:
    """(busy, total) ticks of every CPU since boot, from /proc/stat's first line."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    total = sum(fields[:8])  # guest time is counted in user already
    return total - idle, total


def _stat(path: Path) -> tuple[str, list[str]] | None:
    """A /proc stat file's name and the fields after it (field 3 first); None once gone."""
    try:
        text = path.read_text()
    except OSError:
        return None
    return text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()


def _tree(pid: int) -> list[int]:
    """``pid`` and every process descended from it."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (found := _stat(entry / "stat")) is not None:
            parents.setdefault(int(found[1][1]), []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo += parents.get(tree[-1], [])
    return tree


def _threads(pids: list[int]) -> Counter[str]:
    """CPU ticks (user + system) of each thread name of ``pids``."""
    found: Counter[str] = Counter()
    for pid in pids:
        tasks = Path(f"/proc/{pid}/task")
        for task in tasks.iterdir() if tasks.exists() else ():
            if (stat := _stat(task / "stat")) is not None:
                name, rest = stat
                found[name] += int(rest[11]) + int(rest[12])  # utime, stime: fields 14, 15
    return found


class CpuUse:
    """The CPU a series used, from ``start()`` to ``stop()``; see the module's docstring."""

    def __init__(self, pid: int, *, perf_to: Path | None = None, perf_seconds: float = 0.5):
        self.pid = pid
        self.perf_to = perf_to if perf_to is not None and shutil.which("perf") else None
        self.perf_seconds = perf_seconds
        self.found: dict[str, Any] = {}
        self._perf: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if self.perf_to is not None:
            command = ["perf", "record", "-q", "-F", "1999", "-g", "-p", str(self.pid)]
            command += ["-o", str(self.perf_to), "--", "sleep", str(self.perf_seconds)]
            self._perf = subprocess.Popen(
                command,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        self._started = time.monotonic()
        self._machine = _machine()
        self._pids = _tree(self.pid)
        self._threads = _threads(self._pids)

    def stop(self) -> None:
        seconds = time.monotonic() - self._started
        busy, total = _machine()
        threads = _threads(self._pids) - self._threads
        cpus = os.cpu_count() or 1
        self.found = {
            "seconds": seconds,
            "machine_cpus": (busy - self._machine[0]) / max(total - self._machine[1], 1) * cpus,
            "process_cpus": sum(threads.values()) / TICK / seconds,
            "threads_cpus": {name: n / TICK / seconds for name, n in threads.most_common()},
        }
        if self._perf is not None:
            try:
                self._perf.wait(timeout=self.perf_seconds + 30)
            except subprocess.TimeoutExpired:
                self._perf.kill()
