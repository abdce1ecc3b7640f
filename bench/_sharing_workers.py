"""Worker processes of the sharing benchmark: start N, hold them at a barrier, collect their JSON.

A worker is ``python bench/bench_sharing.py --worker SPEC`` (SPEC is JSON with a
``kind``). It prepares (context, module, client, session...), writes a ready
line, waits for ``go`` on its stdin, measures, and writes one result line;
other lines it prints are passed on as progress. The parent starts every
worker of a series, waits until all are ready (the barrier), releases them
together and collects the results; every wait has a deadline, and a worker
that misses one is killed and named in the error.
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

SCRIPT = Path(__file__).with_name("bench_sharing.py")
PREFIX = "@sharing "
"""Lines of the protocol start with this; anything else a worker prints is ignored."""


class Window(Protocol):
    """Something measured while the workers run (``bench/_cpu_use.py``)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


Spec = dict[str, Any]
Result = dict[str, Any]
Run = Callable[[], Result]


class WorkerError(RuntimeError):
    """A worker failed, or missed a deadline."""


def _send(message: Mapping[str, Any]) -> None:
    sys.stdout.write(PREFIX + json.dumps(message) + "\n")
    sys.stdout.flush()


def worker_main(spec: Spec, prepare: Callable[[Spec], Run]) -> int:
    """In the worker: prepare, report ready, wait for ``go``, run, report the result."""
    try:
        run = prepare(spec)
        _send({"ready": True})
        if sys.stdin.readline().strip() != "go":
            return 3  # the parent gave up on the series
        _send({"result": run()})
        return 0
    except BaseException:
        _send({"error": traceback.format_exc(limit=8)})
        return 1


class _Worker:
    def __init__(self, index: int, spec: Spec, env: Mapping[str, str] | None, log: IO[str]) -> None:
        self.index, self.kind, self.log = index, spec["kind"], log
        self.process = subprocess.Popen(
            [sys.executable, str(SCRIPT), "--worker", json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=dict(env) if env is not None else None,
            text=True,
        )
        self.messages: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(PREFIX):
                self.messages.put(json.loads(line[len(PREFIX) :]))
            else:  # its progress lines, passed on
                sys.stdout.write(f"    [{self.kind} {self.index}] {line}")
                sys.stdout.flush()
        self.messages.put(None)  # end of output

    def expect(self, key: str, deadline: float) -> Any:
        """The next message's ``key``; raises on an error, an early exit or the deadline."""
        try:
            message = self.messages.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise WorkerError(f"{self.name} sent no {key!r} in time{self.stderr_tail()}") from None
        if message is None:
            code = self.process.wait(timeout=10)
            raise WorkerError(f"{self.name} exited ({code}) before {key!r}{self.stderr_tail()}")
        if "error" in message:
            raise WorkerError(f"{self.name} failed:\n{message['error']}{self.stderr_tail()}")
        return message[key]

    @property
    def name(self) -> str:
        return f"worker {self.index} ({self.kind}, pid {self.process.pid})"

    def stderr_tail(self) -> str:
        self.log.flush()
        with open(self.log.name, errors="replace") as text:
            tail = text.read()[-1500:].strip()
        return f"\n--- its stderr:\n{tail}" if tail else ""

    def release(self, word: str) -> None:
        assert self.process.stdin is not None
        with contextlib.suppress(OSError):  # it may have died: expect() says why
            self.process.stdin.write(word + "\n")
            self.process.stdin.flush()

    def finish(self, grace: float) -> None:
        """Reap it; kill it if it has not exited within ``grace`` seconds."""
        with contextlib.suppress(OSError):
            if self.process.stdin is not None:
                self.process.stdin.close()
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def run_workers(
    specs: Sequence[Spec],
    *,
    env: Mapping[str, str] | None = None,
    ready_timeout: float = 90.0,
    run_timeout: float = 120.0,
    window: Window | None = None,
) -> list[Result]:
    """Start one worker per spec, release them together once all are ready, return results;
    ``window`` is started as they are released and stopped when the first result comes."""
    with tempfile.TemporaryDirectory(prefix="accy-sharing-") as folder:
        logs = [open(Path(folder) / f"w{i}.log", "w+") for i in range(len(specs))]  # noqa: SIM115
        workers: list[_Worker] = []
        grace = 0.5  # after a failure: the others are killed, not waited for
        try:
            for index, spec in enumerate(specs):
                workers.append(_Worker(index, spec, env, logs[index]))
            deadline = time.monotonic() + ready_timeout
            for worker in workers:
                worker.expect("ready", deadline)
            if window is not None:
                window.start()
            for worker in workers:
                worker.release("go")
            deadline = time.monotonic() + run_timeout
            results = [workers[0].expect("result", deadline)]
            if window is not None:
                window.stop()
            results += [worker.expect("result", deadline) for worker in workers[1:]]
            grace = 15.0
            return results
        finally:
            for worker in workers:
                worker.release("stop")  # only read by one still at the barrier
            for worker in workers:
                worker.finish(grace)
            for log in logs:
                log.close()
