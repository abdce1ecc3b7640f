"""The front's end of one worker's channel: batched sends, round trips, notifications, loss.

``Channel`` owns the worker process and its socket. Callers ``post`` one-way
ops (appended to a batch), ``flush`` them (the batch and one more op, as ONE
frame), or ``call`` (a round trip: the batch and the op, then block for the
answer). One reader thread takes every frame the worker sends: answers wake
their callers, ``DATA`` goes to the caller's sink, ``NOTIFIED`` runs callbacks.

Loss. When the worker reports ``FATAL``, or its channel reaches end-of-file, or
a send fails, the channel is *dead*: every call waiting is woken with a
``DeviceFault`` naming the device and the reason, every registered callback
runs (waiters wake, then see the fault on their next wait), and ``on_fault`` is
called once, from the reader thread. A channel closed or killed on purpose is
dead too, with ``Unavailable`` instead, and calls no ``on_fault``. With
``hang_seconds``, a worker whose channel stays silent that long is killed and
lost the same way (``accyd.backends.worker.front.liveness``): no call waits on a stopped worker.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from accyd.backends.host_streams import call_quietly
from accyd.backends.worker.front.liveness import watch_liveness
from accyd.backends.worker.protocol import FrameReader, Op, decode_error, send_frame
from accyd.errors import AccyError, DeviceFault, RuntimeUnavailable, Unavailable

__all__ = ["Channel"]

log = structlog.get_logger("accyd.backends.worker")

REAP_SECONDS = 2.0
"""How long the reader waits for a worker whose channel closed to exit, before killing it."""


class _Call:
    """One round trip in flight: its caller blocks on ``done`` until the reader answers."""

    __slots__ = ("done", "error", "sink", "value")

    def __init__(self, sink: Callable[[Any], None] | None) -> None:
        self.done = threading.Lock()
        self.done.acquire()
        self.value: Any = None
        self.error: BaseException | None = None
        self.sink = sink

    def finish(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error
        self.sink = None  # the reader may hold this call a while: not the caller's buffer
        self.done.release()

    def wait(self) -> Any:
        self.done.acquire()
        if self.error is not None:
            raise self.error
        return self.value


def _nothing() -> None:
    return None


def _exit_reason(status: int | None) -> str:
    if status is None:
        return "its channel closed"
    if status < 0:
        try:
            return f"it was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"it was killed by signal {-status}"
    return f"it exited with status {status}"


class Channel:
    """One worker process and its socket, for one ``WorkerBackend`` (see the module doc).

    Owns the process and the socket (both reaped and closed by the reader once
    the worker is gone; ``close`` waits for that). ``name`` starts every error message:
    ``"the device worker for device 0 (host)"``.
    """

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        sock: socket.socket,
        name: str,
        on_fault: Callable[[DeviceFault], None] | None = None,
        hang_seconds: float | None = None,
    ) -> None:
        self.name = name
        self.process = process
        self._sock = sock
        self._on_fault = on_fault
        self._out = threading.Lock()
        self._batch: list[tuple[Any, ...]] = []
        self._state = threading.Lock()
        self._calls: dict[int, _Call] = {}
        self._watches: dict[int, Callable[[], None]] = {}
        self._call_ids = itertools.count(1)
        self._watch_ids = itertools.count(1)
        self.dead = False
        """Set once: faulted, closed or killed. Read without a lock on the hot path."""
        self.fault: DeviceFault | None = None
        self._closing = False
        self._fatal: BaseException | None = None
        self.ready = threading.Event()
        self.info: dict[str, Any] = {}
        self.start_error: BaseException | None = None
        self._waiting_since: float | None = None
        self._hung: str | None = None
        self._reader = threading.Thread(target=self._read, name="accy-worker-reader", daemon=True)
        self._reader.start()
        if hang_seconds is not None:
            watch_liveness(self, hang_seconds)

    # -- sending ------------------------------------------------------------------------------

    def dead_error(self) -> AccyError:
        """What a call on a dead channel raises (a fresh instance per caller)."""
        fault = self.fault
        if fault is not None:
            return DeviceFault(fault.message)
        return Unavailable(f"{self.name} is closed")

    def post(self, op: tuple[Any, ...]) -> None:
        """Append a one-way op to the batch; it goes with the next flush."""
        if self.dead:
            raise self.dead_error()
        with self._out:
            self._batch.append(op)

    def post_quietly(self, op: tuple[Any, ...]) -> None:
        """``post`` for frees: nothing to free in a dead worker, so nothing happens."""
        if not self.dead:
            with self._out:
                self._batch.append(op)

    def flush(self, op: tuple[Any, ...], counter: Any = None) -> int:
        """Send the batch and ``op`` as one frame. With ``counter`` (an object with an int
        ``recorded``): bump it in the frame's order and return the new value."""
        if self.dead:
            raise self.dead_error()
        with self._out:
            count = 0
            if counter is not None:
                count = counter.recorded = counter.recorded + 1
            batch, self._batch = self._batch, []
            batch.append(op)
            sent = self._send(batch)
        if not sent:
            raise self.dead_error()
        return count

    def _send(self, frame: Any) -> bool:
        """Send under ``_out``; a broken channel dies (its callbacks run on another thread,
        never under ``_out``) and this says False."""
        try:
            send_frame(self._sock, frame)
        except OSError as error:
            after = self._die(f"sending to it failed: {error}")
            threading.Thread(target=after, name="accy-worker-lost", daemon=True).start()
            return False
        return True

    def call(
        self,
        build: Callable[[int], tuple[Any, ...]],
        *,
        sink: Callable[[Any], None] | None = None,
        more: Callable[[int], Iterable[tuple[Any, ...]]] | None = None,
    ) -> Any:
        """A round trip: flush the batch with ``build(call id)``, send each of ``more(call id)``
        as a frame of its own, wait for the answer (``sink`` takes ``DATA`` on the reader)."""
        cid = next(self._call_ids)
        pending = _Call(sink)
        with self._state:
            if self.dead:
                raise self.dead_error()
            self._calls[cid] = pending
        with self._out:
            batch, self._batch = self._batch, []
            batch.append(build(cid))
            sent = self._send(batch)
        for op in more(cid) if more is not None else ():
            if not sent:
                break
            with self._out:
                sent = self._send([op])
        return pending.wait()

    def watch(self, callback: Callable[[], None]) -> int:
        """Register ``callback`` for a ``NOTIFIED`` (or the channel's loss); its id."""
        nid = next(self._watch_ids)
        with self._state:
            if self.dead:
                raise self.dead_error()
            self._watches[nid] = callback
        return nid

    # -- receiving -------------------------------------------------------------------------------

    @property
    def waiting_since(self) -> float | None:
        """Since when the reader has waited for the worker's next frame (``None``: it is
        running one, or the worker is not ready yet)."""
        return self._waiting_since if self.ready.is_set() else None

    def declare_hung(self, reason: str) -> None:
        """The worker stopped answering: kill it; it is lost with ``reason`` (a fault)."""
        self._hung = reason
        if self.process.returncode is None:
            with contextlib.suppress(OSError):
                self.process.kill()

    def _read(self) -> None:
        reader = FrameReader(self._sock)
        monotonic = time.monotonic
        try:
            while True:
                self._waiting_since = monotonic()
                frame = reader.recv()
                self._waiting_since = None
                kind = frame[0]
                if kind == Op.REPLY:
                    call = self._calls.pop(frame[1], None)
                    if call is not None:
                        call.finish(frame[2])
                elif kind == Op.NOTIFIED:
                    callback = self._watches.pop(frame[1], None)
                    if callback is not None:
                        call_quietly(callback)
                elif kind == Op.DATA:
                    call = self._calls.get(frame[1])
                    if call is not None and call.sink is not None:
                        call.sink(frame[2])
                elif kind == Op.FAILED:
                    call = self._calls.pop(frame[1], None)
                    if call is not None:
                        call.finish(error=decode_error(frame[2]))
                elif kind == Op.READY:
                    self.info = frame[1]
                    self.ready.set()
                elif kind == Op.FATAL:
                    self._fatal = decode_error(frame[1])
                    self._lost(None)
        except (EOFError, OSError):
            pass
        except Exception:  # a protocol bug: the channel cannot be trusted any more
            log.exception("device worker channel broke", worker=self.name)
        self._lost(None)
        self._reap()
        self._sock.close()

    def _reap(self) -> None:
        try:
            self.process.wait(REAP_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _lost(self, reason: str | None) -> None:
        """Kill the channel (once): wake every call, run every callback, report the fault."""
        self._die(reason)()

    def _die(self, reason: str | None) -> Callable[[], None]:
        """Mark the channel dead and wake its calls; what is left to do (callbacks, the
        fault's report), for the caller to run where no lock of ours is held."""
        if self.dead:
            return _nothing
        if reason is None and not self._closing:
            reason = self._describe_exit()
        with self._state:
            if self.dead:
                return _nothing
            self.dead = True
            calls, self._calls = self._calls, {}
            watches, self._watches = self._watches, {}
            fault: DeviceFault | None = None
            if not self._closing:
                fault = self.fault = DeviceFault(f"{self.name} faulted: {reason}")
        if not self.ready.is_set():
            self.start_error = self._fatal or RuntimeUnavailable(
                f"{self.name} did not start: {reason or 'it was closed'}"
            )
            self.ready.set()
            fault = None  # a start that failed is its starter's error, not a fault
        for call in calls.values():
            call.finish(error=self.dead_error())
        on_fault = self._on_fault

        def after() -> None:
            for callback in watches.values():
                call_quietly(callback)
            if fault is not None:
                log.error("device worker lost", worker=self.name, reason=reason)
                if on_fault is not None:
                    call_quietly(functools.partial(on_fault, fault))

        return after

    def _describe_exit(self) -> str:
        fatal = self._fatal
        if fatal is not None:
            return str(fatal)
        if self._hung is not None:
            return self._hung
        try:
            status: int | None = self.process.wait(0.5)
        except subprocess.TimeoutExpired:
            status = None
        return _exit_reason(status)

    # -- lifetime ---------------------------------------------------------------------------------

    def wait_ready(self, timeout: float) -> dict[str, Any]:
        """Block until the worker sent ``READY``; its info. Raises the start's error (the
        worker's own, such as ``RuntimeUnavailable``), or ``RuntimeUnavailable`` on a timeout."""
        if not self.ready.wait(timeout):
            self.kill()
            raise RuntimeUnavailable(f"{self.name} was not ready within {timeout:g} s")
        if self.start_error is not None:
            raise self.start_error
        return self.info

    def close(self, timeout: float = 5.0) -> None:
        """Ask the worker to close its backend and exit; past ``timeout`` s, kill it. Idempotent;
        returns once the process is reaped and the reader ended (unless called from it)."""
        with self._state:
            if self._closing:
                first = False
            else:
                self._closing = first = True
        if first and not self.dead:
            # On a thread: a hung worker reads nothing, and a full socket would block the
            # send until the kill below breaks it.
            threading.Thread(target=self._send_close, name="accy-worker-close", daemon=True).start()
        if first:
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("device worker did not close in time; killing it", worker=self.name)
                self.process.kill()
        self._finish()

    def _send_close(self) -> None:
        with self._out:
            batch, self._batch = self._batch, []
            batch.append((Op.CLOSE,))
            self._send(batch)

    def kill(self) -> None:
        """End the worker now (SIGKILL); idempotent, never blocks for long."""
        with self._state:
            self._closing = True
        if self.process.returncode is None:
            with contextlib.suppress(OSError):
                self.process.kill()
        self._lost(None)

    def _finish(self) -> None:
        self._lost(None)
        if threading.current_thread() is not self._reader:
            self._reader.join(REAP_SECONDS + 1.0)
