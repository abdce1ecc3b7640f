"""``DevicePool``: per device, the active worker and a warm spare that replaces it at once.

A spare is a worker started, its backend made (for CUDA: ``cuInit`` and the
primary context) and idle, so ``replace`` after a fault is a swap: kill the
faulted worker, promote the spare, start the next spare in the background.
Workers for all devices start in parallel; the constructor returns once every
active one is ready, and spares start after that (they would slow the actives'
start on a small machine). On CUDA a spare holds a context of its own: about
0.5 GiB of the device's memory per device (``spares=False`` gives it back, and
``replace`` then starts a worker cold: about 1.5 s with ``cuInit``).

Faults. Each worker reports its loss once (``WorkerBackend``'s ``on_fault``); the
pool passes an active worker's to ``on_fault(device, fault)``, from that worker's
reader thread (the handler may call ``replace`` there). A spare that dies idle
is replaced in the background, up to ``SPARE_RETRIES`` times in a row. A worker
silent for ``hang_seconds`` (stopped or hung) is lost the same way
(``accyd.backends.worker.front.liveness``), so it is replaced within that bound.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path

import structlog

from accyd.backends.base import Backend
from accyd.backends.select import cuda_present
from accyd.backends.worker.front.liveness import DEFAULT_HANG_SECONDS
from accyd.backends.worker.front.proxy import WorkerBackend
from accyd.errors import DeviceFault, NotFound, Unavailable, UnsupportedOperation

__all__ = ["SPARE_RETRIES", "DevicePool"]

log = structlog.get_logger("accyd.backends.worker")

SPARE_RETRIES = 3
"""Spares of one device that may die idle in a row (no ``replace`` between) before the pool
stops starting them; ``replace`` then starts one cold."""


class _Slot:
    """One device: its active worker, its spare (starting or ready), and a lock for replaces."""

    __slots__ = ("active", "lock", "spare", "spare_deaths")

    def __init__(self, active: WorkerBackend) -> None:
        self.active = active
        self.spare: Future[WorkerBackend] | None = None
        self.spare_deaths = 0
        self.lock = threading.Lock()


class DevicePool:
    """The workers of a set of devices. Owns every worker it starts: ``close()`` ends them all.

    ``kind``: ``cuda``, ``host`` or ``auto`` (resolved once, here, with ``cuda_present``).
    """

    def __init__(
        self,
        kind: str,
        devices: Sequence[int],
        *,
        cache_dir: Path | None = None,
        host_memory_limit: int | None = None,
        spares: bool = True,
        on_fault: Callable[[int, DeviceFault], None] | None = None,
        start_timeout: float = 60.0,
        log_format: str = "console",
        log_level: str = "info",
        gpus: Mapping[int, int] | None = None,
        hang_seconds: float | None = DEFAULT_HANG_SECONDS,
    ) -> None:
        if kind == "auto":
            kind = "cuda" if cuda_present() else "host"
        if kind not in ("cuda", "host"):
            raise UnsupportedOperation(f"unknown backend {kind!r}; choose auto, cuda or host")
        self.kind = kind
        self._options = (cache_dir, host_memory_limit, log_format, log_level)
        self._gpus = dict(gpus or {})
        """The GPU ordinal of each device whose index is not its ordinal."""
        self._spares = spares
        self._on_fault = on_fault
        self._start_timeout = start_timeout
        self._hang_seconds = hang_seconds
        self._lock = threading.Lock()
        self._slots: dict[int, _Slot] = {}
        self._workers: list[WorkerBackend] = []
        self._closed = False
        self._requests: queue.SimpleQueue[tuple[int, Future[WorkerBackend]] | None]
        self._requests = queue.SimpleQueue()
        threading.Thread(target=self._starter, name="accy-spares", daemon=True).start()
        try:
            starting = {device: self._spawn(device) for device in dict.fromkeys(devices)}
            for worker in starting.values():
                worker.wait_ready(start_timeout)
        except BaseException:
            self.close()
            raise
        with self._lock:
            self._slots = {device: _Slot(worker) for device, worker in starting.items()}
            if spares:
                for device, slot in self._slots.items():
                    slot.spare = self._start_spare(device)

    @property
    def backends(self) -> dict[int, Backend]:
        """The active backend of each device (a new dict each time)."""
        with self._lock:
            return {device: slot.active for device, slot in self._slots.items()}

    @property
    def spares(self) -> dict[int, WorkerBackend]:
        """The ready spare of each device that has one now."""
        ready = {}
        with self._lock:
            for device, slot in self._slots.items():
                spare = slot.spare
                if spare is not None and spare.done() and spare.exception() is None:
                    ready[device] = spare.result()
        return ready

    def wait_for_spares(self, timeout: float) -> bool:
        """Block until every device's spare is ready (at most ``timeout`` s); whether they are."""
        deadline = time.monotonic() + timeout
        with self._lock:
            futures = [slot.spare for slot in self._slots.values()]
        for future in futures:
            if future is None:
                return False
            try:
                future.result(max(0.0, deadline - time.monotonic()))
            except Exception:
                return False
        return True

    def _spawn(self, device: int) -> WorkerBackend:
        """Start a worker (not yet ready) whose loss comes to ``_faulted``."""
        pool = weakref.ref(self)
        me: list[weakref.ref[WorkerBackend]] = []

        def on_fault(fault: DeviceFault) -> None:
            owner, worker = pool(), me[0]() if me else None
            if owner is not None and worker is not None:
                owner._faulted(device, worker, fault)

        cache_dir, host_memory_limit, log_format, log_level = self._options
        gpu = self._gpus.get(device, device)
        worker = WorkerBackend(
            self.kind,
            gpu,
            name=f"device {device}" if gpu == device else f"device {device} (GPU {gpu})",
            cache_dir=cache_dir,
            host_memory_limit=host_memory_limit,
            on_fault=on_fault,
            start_timeout=None,
            log_format=log_format,
            log_level=log_level,
            hang_seconds=self._hang_seconds,
        )
        me.append(weakref.ref(worker))
        with self._lock:
            closed = self._closed
            if not closed:
                self._workers = [w for w in self._workers if not w.reaped] + [worker]
        if closed:
            worker.kill()
            raise Unavailable("the device pool is closed")
        return worker

    def _start_spare(self, device: int) -> Future[WorkerBackend]:
        """Ask the starter thread for a spare; the future is its ready worker. Quick: a
        ``replace`` calls it, and a thread's start would wait for that thread to run."""
        future: Future[WorkerBackend] = Future()
        self._requests.put((device, future))
        return future

    def _starter(self) -> None:
        """Start each spare asked for (``Popen``), then wait for it on a thread of its own."""
        while (request := self._requests.get()) is not None:
            device, future = request
            try:
                worker = self._spawn(device)
            except BaseException as error:
                future.set_exception(error)
                continue
            threading.Thread(
                target=self._await_spare,
                args=(device, worker, future),
                name=f"accy-spare-{device}",
                daemon=True,
            ).start()

    def _await_spare(
        self, device: int, worker: WorkerBackend, future: Future[WorkerBackend]
    ) -> None:
        try:
            worker.wait_ready(self._start_timeout)
        except BaseException as error:
            if not self._closed:
                log.warning("spare device worker did not start", device=device, error=error)
            future.set_exception(error)
            return
        future.set_result(worker)

    def _faulted(self, device: int, worker: WorkerBackend, fault: DeviceFault) -> None:
        """A worker was lost (on its reader thread): report an active one, replace a spare."""
        with self._lock:
            slot = self._slots.get(device)
            if self._closed or slot is None:
                return
            active = slot.active is worker
            spare = slot.spare
            idle_spare = (
                spare is not None
                and spare.done()
                and spare.exception() is None
                and spare.result() is worker
            )
            if idle_spare:
                slot.spare = None
                slot.spare_deaths += 1
                if self._spares and slot.spare_deaths <= SPARE_RETRIES:
                    slot.spare = self._start_spare(device)
        if active:
            log.error("device worker faulted", device=device, reason=fault.message)
            if self._on_fault is not None:
                self._on_fault(device, fault)
        elif idle_spare:
            log.warning("spare device worker lost", device=device, reason=fault.message)
            worker.kill()

    def replace(self, device: int) -> Backend:
        """Kill ``device``'s active worker and promote its spare (or start one cold if there is
        none); start a new spare. The new active backend. Thread-safe: one replace per device
        at a time; callable from ``on_fault``."""
        started = time.perf_counter()
        slot = self._slots.get(device)
        if slot is None:
            raise NotFound(f"the device pool has no device {device}")
        with slot.lock:
            with self._lock:
                if self._closed:
                    raise Unavailable("the device pool is closed")
                old, future, slot.spare = slot.active, slot.spare, None
                slot.spare_deaths = 0
            old.kill()
            worker = None
            if future is not None:
                try:
                    worker = future.result(self._start_timeout)
                except Exception:  # logged by its starter; start one cold instead
                    worker = None
                if worker is not None and not worker.alive:
                    worker.kill()
                    worker = None
            cold = worker is None
            if worker is None:
                worker = self._spawn(device)
                worker.wait_ready(self._start_timeout)
            with self._lock:
                slot.active = worker
                if self._spares and not self._closed:
                    slot.spare = self._start_spare(device)
        log.info(
            "device worker replaced",
            device=device,
            old_pid=old.pid,
            new_pid=worker.pid,
            cold=cold,
            ms=round((time.perf_counter() - started) * 1000, 2),
        )
        fault = worker.fault
        if fault is not None and self._on_fault is not None:  # lost while being promoted
            self._on_fault(device, fault)
        return worker

    def close(self) -> None:
        """End every worker, active and spare (each asked to close, killed past 5 s); idempotent.
        Returns once every worker process has been reaped."""
        with self._lock:
            if not self._closed:
                self._requests.put(None)  # the starter ends
            self._closed = True
            workers, self._workers = self._workers, []
        closers = [
            threading.Thread(target=worker.close, name="accy-worker-close") for worker in workers
        ]
        for closer in closers:
            closer.start()
        for closer in closers:
            closer.join()
