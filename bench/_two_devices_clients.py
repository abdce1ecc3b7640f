"""The two-device benchmark's client processes: device_scan loops with checked results, and the
pool that starts them, holds them at a barrier, releases them together and collects their counts.

A worker is ``python bench/two_devices.py --worker SPEC`` (SPEC is JSON). It attaches, loads
``accy.kernel.device_scan`` on its device with scratch for ``n``, checks one launch on random data
fully against numpy, writes a ``ready`` line and waits for ``go`` on its stdin. Then it launches
(each launch waited) until ``seconds`` have passed or a ``stop`` line comes, alternating an input
of ones and one of twos, and on every ``check_every``-th launch reads the result's last element
back: it must be n (ones) or 2n (twos), so a launch that wrote nothing, or read the other input,
fails the check. Errors are counted by kind (class and reason), not raised: the loop pauses a
little and goes on. Its result line holds its counts, the first error of each kind with its time
and, with ``times``, the monotonic time of every checked result (the parent compares them with
the fault's; ``time.monotonic`` is one clock for every process of the machine).
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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from accy import Client, errors

__all__ = [
    "SCAN",
    "CheckFailed",
    "Pool",
    "ScanClient",
    "WorkerError",
    "check_last",
    "describe",
    "is_lost",
    "kind_of",
    "relative_error",
    "run_loop",
    "worker_main",
]

SCAN = "accy.kernel.device_scan"
SCRIPT = Path(__file__).with_name("two_devices.py")
PREFIX = "@two-devices "
"""Lines of the protocol start with this; anything else a worker prints is passed on."""
RETRY_PAUSE = 0.01
"""Seconds a loop waits after an error before it launches again."""
LOST_REASONS = frozenset({"DEVICE_LOST", "BUFFER_LOST"})

Spec = dict[str, Any]
Result = dict[str, Any]


class CheckFailed(AssertionError):
    """A device_scan result that is not numpy's."""


class WorkerError(RuntimeError):
    """A worker failed, or missed a deadline."""


def describe(error: BaseException) -> str:
    """One line for a report: class, status code and reason, message."""
    if isinstance(error, errors.AccyError):
        return f"{type(error).__name__} {error.code.name} {error.reason or '-'}: {error.message}"
    return f"{type(error).__name__}: {error}"


def kind_of(error: BaseException) -> str:
    """What errors of one kind share: the class and, for a daemon's error, its reason."""
    if isinstance(error, errors.AccyError):
        return f"{type(error).__name__} {error.reason or error.code.name}"
    return type(error).__name__


def is_lost(error: BaseException) -> bool:
    """Whether ``error`` says the object it was about is gone with its device (or daemon)."""
    if isinstance(error, errors.BufferLost):
        return True
    return isinstance(error, errors.AccyError) and error.reason in LOST_REASONS


def relative_error(got: np.ndarray[Any, Any], data: np.ndarray[Any, Any]) -> float:
    """Relative L2 error of ``got`` against numpy's inclusive prefix sum of ``data``."""
    want = np.cumsum(data, dtype=np.float64)
    error = float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))
    if not error < 1e-5:
        raise CheckFailed(f"device_scan relative error {error:.3g} against numpy")
    return error


def check_last(got: float, n: int, factor: int) -> None:
    """The last element of the prefix sum of ``n`` copies of ``factor`` must be ``factor * n``
    (exact in float32 to 2^24, and at 2^26 with 4096-element tiles; within two ulps past that)."""
    want = float(factor) * n
    if not abs(float(got) - want) <= want * 2.0**-22:
        raise CheckFailed(f"device_scan of {n} x {factor}: last element {got}, want {want:g}")


class ScanClient:
    """device_scan on one device for one client: a session with scratch for ``n``, two inputs
    (ones and twos) and an output, all on ``device``.

    The daemon owns the device memory; the buffers and the session are freed when the client
    closes them or detaches. Launches run in order on the session's stream; each is waited.
    """

    def __init__(self, client: Client, device: int, n: int) -> None:
        self.client, self.device, self.n = client, device, n
        self.session = client.load(SCAN, device=device)
        self.session.allocate_intermediates(n=n)
        self.inputs = [client.empty(n, "f32", device=device) for _ in range(2)]
        self.output = client.empty(n, "f32", device=device)
        self.launches = 0

    def check_fully(self, seed: int) -> float:
        """One launch on random data, every element checked; then the inputs get ones and twos."""
        data = np.random.default_rng(seed).random(self.n, dtype=np.float32)
        self.inputs[0].write(data)
        self.session.launch([self.inputs[0]], [self.output], n=self.n)
        error = relative_error(self.output.read(), data)
        for factor, buffer in enumerate(self.inputs, start=1):
            buffer.write(np.full(self.n, factor, np.float32))
        return error

    def step(self, check: bool) -> bool:
        """One waited launch on the next input; with ``check``, its last element is read back
        and compared (``CheckFailed`` if wrong). Returns whether it was checked."""
        index = self.launches % 2
        self.session.launch([self.inputs[index]], [self.output], n=self.n)
        self.launches += 1
        if check:
            (got,) = self.output.read(count=1, offset=(self.n - 1) * 4)
            check_last(got, self.n, index + 1)
        return check


def run_loop(
    scan: ScanClient, seconds: float, check_every: int, stop: threading.Event, times: bool
) -> Result:
    """Launch until ``seconds`` pass or ``stop`` is set; count launches, checks and errors."""
    first = scan.launches
    checked = 0
    kinds: dict[str, int] = {}
    firsts: list[dict[str, Any]] = []
    good: list[float] = []
    started = time.monotonic()
    end = started + seconds
    while not stop.is_set() and time.monotonic() < end:
        try:
            if scan.step(check=(scan.launches - first) % check_every == 0):
                checked += 1
                if times:
                    good.append(time.monotonic())
        except (errors.AccyError, CheckFailed) as error:
            kind = kind_of(error)
            if kind not in kinds:
                firsts.append({"t": time.monotonic(), "error": describe(error)})
            kinds[kind] = kinds.get(kind, 0) + 1
            time.sleep(RETRY_PAUSE)
    elapsed = time.monotonic() - started
    launches = scan.launches - first
    return {
        "device": scan.device,
        "launches": launches,
        "checked": checked,
        "seconds": elapsed,
        "per_second": launches / elapsed if elapsed > 0 else 0.0,
        "errors": sum(kinds.values()),
        "error_kinds": kinds,
        "first_errors": firsts,
        "started": started,
        "good_times": good,
    }


# -- in the worker process ------------------------------------------------------------------


def _send(message: Mapping[str, Any]) -> None:
    sys.stdout.write(PREFIX + json.dumps(message) + "\n")
    sys.stdout.flush()


def _stop_on_line(stop: threading.Event) -> None:
    """Set ``stop`` at the parent's ``stop`` line, or when its end of the pipe closes."""
    with contextlib.suppress(OSError, ValueError):
        sys.stdin.readline()
    stop.set()


def worker_main(spec: Spec) -> int:
    """In the worker: attach and prepare, report ready, wait for ``go``, loop, report counts."""
    try:
        client = Client(
            spec["target"], client_name=spec["name"], timeout=float(spec.get("timeout", 60.0))
        )
        scan = ScanClient(client, int(spec["device"]), int(spec["n"]))
        full_error = scan.check_fully(int(spec.get("seed", 0)))
        _send({"ready": True})
        if sys.stdin.readline().strip() != "go":
            return 3  # the parent gave up on the phase
        stop = threading.Event()
        threading.Thread(target=_stop_on_line, args=(stop,), daemon=True).start()
        result = run_loop(
            scan,
            float(spec["seconds"]),
            int(spec.get("check_every", 1)),
            stop,
            bool(spec.get("times", False)),
        )
        result |= {"full_check_error": full_error, "reattachments": client.reattachments}
        with contextlib.suppress(errors.AccyError):
            client.close()
        _send({"result": result})
        return 0
    except BaseException:
        _send({"error": traceback.format_exc(limit=8)})
        return 1


# -- in the parent ------------------------------------------------------------------------


class _Worker:
    def __init__(self, index: int, spec: Spec, log: IO[str]) -> None:
        self.index, self.log = index, log
        self.label = f"device {spec['device']}"
        self.process = subprocess.Popen(
            [sys.executable, str(SCRIPT), "--worker", json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        self.messages: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(PREFIX):
                self.messages.put(json.loads(line[len(PREFIX) :]))
            else:
                sys.stdout.write(f"    [worker {self.index}] {line}")
        self.messages.put(None)

    @property
    def name(self) -> str:
        return f"worker {self.index} ({self.label}, pid {self.process.pid})"

    def expect(self, key: str, deadline: float) -> Any:
        """The next message's ``key``; raises on an error, an early exit or the deadline."""
        try:
            message = self.messages.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise WorkerError(f"{self.name} sent no {key!r} in time{self._tail()}") from None
        if message is None:
            code = self.process.wait(timeout=10)
            raise WorkerError(f"{self.name} exited ({code}) before {key!r}{self._tail()}")
        if "error" in message:
            raise WorkerError(f"{self.name} failed:\n{message['error']}{self._tail()}")
        return message[key]

    def _tail(self) -> str:
        self.log.flush()
        tail = Path(self.log.name).read_text(errors="replace")[-1500:].strip()
        return f"\n--- its stderr:\n{tail}" if tail else ""

    def say(self, word: str) -> None:
        assert self.process.stdin is not None
        with contextlib.suppress(OSError):  # it may have died: expect() says why
            self.process.stdin.write(word + "\n")
            self.process.stdin.flush()

    def finish(self, grace: float) -> None:
        with contextlib.suppress(OSError):
            if self.process.stdin is not None:
                self.process.stdin.close()
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


class Pool:
    """One phase's worker processes, one per spec: ``ready`` waits for all of them (the
    barrier), ``go`` releases them together, ``stop`` ends loops early, ``results`` collects.

    Every wait has a deadline; leaving the ``with`` block reaps the workers, killing those
    that do not exit in time (at once after a failure).
    """

    def __init__(self, specs: Sequence[Spec]) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="accy-two-devices-")
        self._logs: list[IO[str]] = []
        self.workers: list[_Worker] = []
        self._grace = 0.5
        try:
            for index, spec in enumerate(specs):
                log = open(Path(self._folder.name) / f"w{index}.log", "w+")  # noqa: SIM115
                self._logs.append(log)
                self.workers.append(_Worker(index, spec, log))
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for worker in self.workers:
            worker.expect("ready", deadline)

    def go(self) -> float:
        """Release every worker; returns the monotonic time just before."""
        began = time.monotonic()
        for worker in self.workers:
            worker.say("go")
        return began

    def stop(self) -> None:
        for worker in self.workers:
            worker.say("stop")

    def results(self, timeout: float) -> list[Result]:
        deadline = time.monotonic() + timeout
        found = [worker.expect("result", deadline) for worker in self.workers]
        self._grace = 15.0
        return found

    def close(self) -> None:
        for worker in self.workers:
            worker.say("stop")  # read only by one still at the barrier
        for worker in self.workers:
            worker.finish(self._grace)
        for log in self._logs:
            log.close()
        self._folder.cleanup()
