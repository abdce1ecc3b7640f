"""The worker's side of the protocol: every op the front sends, run on the backend.

Threads. The worker's main thread reads frames and runs the quick ops itself,
in the order the front sent them, so each stream's order is the front's:
launches, replays, records, waits, notifications, event queries, stream
creation, drops. Ops that may block run on ``_calls`` (a thread pool): allocations,
compiles and loads, ``prepare``, synchronizations, copies, and pinning and
unpinning the front's shared memory (``served_pins``). Frees (buffers,
kernels, prepared launches, streams) run one after another on ``_frees``: a CUDA
free may wait for the device, and an allocation first waits for the frees sent
before it, so a freed buffer's memory is back before the next one is asked for.

Errors. A round trip's error is its answer (``FAILED``). A one-way op's error
is kept for its stream (the first one only, as a stream's first failure is) and
raised by the next round trip that waits for that stream: ``SYNCHRONIZE`` of it
or of the whole device, ``SYNC_EVENT`` of an event recorded on it after the
failure, and ``WRITE``/``READ`` on it. A ``DeviceFault`` from anything ends the
worker (``fatal``): the context is poisoned and only a new process clears it.
"""

from __future__ import annotations

import os
import pickle
import socket
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from accyd.backends.base import Backend, Event
from accyd.backends.worker.child.state import ServedState
from accyd.backends.worker.protocol import ALL_STREAMS, CHUNK_BYTES, Op
from accyd.errors import LaunchArgumentMismatch, LaunchFailed, RuntimeUnavailable

__all__ = ["Served"]

_Handler = Callable[[tuple[Any, ...]], None]


class Served(ServedState):
    """Runs the front's ops on one backend (see the module doc for threads and errors)."""

    def __init__(
        self,
        backend: Backend,
        send: Callable[[Any], None],
        fatal: Callable[[BaseException], NoReturn],
        lane: socket.socket | None = None,
    ) -> None:
        super().__init__(backend, send, fatal)
        self._lane = lane
        handlers: list[_Handler | None] = [None] * Op.COUNT
        for code, handler in {
            Op.ALLOCATE: self._allocate,
            Op.CREATE_ARTIFACT: self._create_artifact,
            Op.CLOSE_ARTIFACT: self._close_artifact,
            Op.LOAD: self._load,
            Op.LAUNCH: self._launch,
            Op.PREPARE: self._prepare,
            Op.REPLAY: self._replay,
            Op.CLOSE_PREPARED: self._close_prepared,
            Op.DESTROY_BUFFER: self._destroy_buffer,
            Op.DESTROY_KERNEL: self._destroy_kernel,
            Op.SYNCHRONIZE: self._synchronize,
            Op.CREATE_STREAM: self._create_stream,
            Op.DESTROY_STREAM: self._destroy_stream,
            Op.RECORD: self._record,
            Op.WAIT_EVENT: self._wait_event,
            Op.EVENT_DONE: self._event_done,
            Op.NOTIFY: self._notify,
            Op.NOTIFY_EVENT: self._notify_event,
            Op.DROP_QUEUED: self._drop_queued,
            Op.SYNC_EVENT: self._sync_event,
            Op.DESTROY_EVENT: self._destroy_event,
            Op.WRITE: self._write,
            Op.WRITE_MORE: self._write_more,
            Op.READ: self._read,
            Op.PIN: self._pin,
            Op.UNPIN: self._unpin,
            Op.WRITE_SHARED: self._write_shared,
            Op.READ_SHARED: self._read_shared,
            Op.EXPORT: self._export,
            Op.SPLIT_SMS: self._split_sms,
        }.items():
            handlers[code] = handler
        self.handlers: Sequence[_Handler | None] = handlers

    # -- running ops -----------------------------------------------------------------------

    def run(self, ops: Sequence[tuple[Any, ...]]) -> bool:
        """Run one frame's ops in order; False once ``CLOSE`` came (the rest is ignored)."""
        handlers = self.handlers
        for op in ops:
            handler = handlers[op[0]]
            if handler is None:  # CLOSE
                return False
            handler(op)
        return True

    # -- memory and kernels ------------------------------------------------------------------

    def _export(self, op: tuple[Any, ...]) -> None:
        _, call, bid = op
        lane = self._lane

        def export() -> tuple[str, int, int, bytes]:
            if lane is None:
                raise RuntimeUnavailable("this worker was started with no lane for descriptors")
            exported = self.backend.export_buffer(self.buffers[bid])
            try:
                socket.send_fds(lane, [b"\x01"], [exported.fd])
            finally:
                os.close(exported.fd)
            return exported.kind.value, exported.mapping_size, exported.offset, exported.gpu_uuid

        self._blocking(call, export)

    def _allocate(self, op: tuple[Any, ...]) -> None:
        _, call, bid, byte_size, alignment, zero, exportable = op
        freed = self._last_free

        def allocate() -> int:
            if freed is not None:
                freed.result()
            buffer = self.backend.allocate_buffer(
                byte_size, alignment=alignment, zero=zero, exportable=exportable
            )
            self.buffers[bid] = buffer
            return buffer.address

        self._blocking(call, allocate)

    def _destroy_buffer(self, op: tuple[Any, ...]) -> None:
        buffer = self.buffers.pop(op[1], None)
        if buffer is not None:
            self._free(lambda: self.backend.destroy(buffer))

    def _create_artifact(self, op: tuple[Any, ...]) -> None:
        _, call, aid, request = op

        def create() -> None:
            self.artifacts[aid] = self.backend.create_artifact(request)

        self._blocking(call, create)

    def _close_artifact(self, op: tuple[Any, ...]) -> None:
        artifact = self.artifacts.pop(op[1], None)
        if artifact is not None:
            artifact.close()

    def _load(self, op: tuple[Any, ...]) -> None:
        _, call, aid, kid = op

        def load() -> None:
            artifact = self.artifacts.get(aid)
            if artifact is None:
                raise RuntimeUnavailable(f"artifact {aid}: the artifact is closed")
            self.kernels[kid] = self.backend.load_artifact(artifact)

        self._blocking(call, load)

    def _destroy_kernel(self, op: tuple[Any, ...]) -> None:
        kernel = self.kernels.pop(op[1], None)
        if kernel is not None:
            self._free(lambda: self.backend.destroy(kernel))

    # -- launches ------------------------------------------------------------------------------

    def _launch(self, op: tuple[Any, ...]) -> None:
        sid = op[1]
        try:
            self.backend.launch(self._request(sid, op[2:]))
        except BaseException as error:
            self._failed(sid, error)

    def _prepare(self, op: tuple[Any, ...]) -> None:
        _, call, pid, launches = op

        def prepare() -> None:
            requests = [self._request(launch[0], launch[1:]) for launch in launches]
            self.prepared[pid] = self.backend.prepare(requests)

        self._blocking(call, prepare)

    def _replay(self, op: tuple[Any, ...]) -> None:
        _, pid, sid, count = op
        try:
            prepared = self.prepared.get(pid)
            if prepared is None:
                raise LaunchFailed("this prepared launch was closed")
            prepared.launch(self._stream(sid), count)
        except BaseException as error:
            self._failed(sid, error)

    def _close_prepared(self, op: tuple[Any, ...]) -> None:
        prepared = self.prepared.pop(op[1], None)
        if prepared is not None:
            self._free(prepared.close)

    # -- streams and events ---------------------------------------------------------------------

    def _create_stream(self, op: tuple[Any, ...]) -> None:
        _, call, sid, partition, priority = op

        def create() -> None:
            self.streams[sid] = self.backend.create_stream(partition, priority)

        self._answer(call, create)

    def _split_sms(self, op: tuple[Any, ...]) -> None:
        _, call, specs = op
        self._answer(call, lambda: self.backend.split_sms(specs))

    def _destroy_stream(self, op: tuple[Any, ...]) -> None:
        sid = op[1]
        stream = self.streams.pop(sid, None)
        with self._errors_lock:
            self._errors.pop(sid, None)
        self._records.pop(sid, None)
        if stream is not None:
            self._free(lambda: self.backend.destroy_stream(stream))

    def _synchronize(self, op: tuple[Any, ...]) -> None:
        _, call, sid = op

        def synchronize() -> None:
            self.backend.synchronize(None if sid == ALL_STREAMS else self._stream(sid))
            self._raise_kept(sid)

        self._blocking(call, synchronize)

    def _record(self, op: tuple[Any, ...]) -> None:
        _, eid, sid = op
        event: Event | None
        try:
            event = self.backend.record_event(self._stream(sid))
        except BaseException as error:
            self._failed(sid, error)
            event = None
        index = self._records.get(sid, 0) + 1
        self._records[sid] = index
        self.events[eid] = (event, sid, index)

    def _wait_event(self, op: tuple[Any, ...]) -> None:
        _, sid, eid = op
        recorded = self.events.get(eid)
        if recorded is None or recorded[0] is None:
            return  # freed (so waited for already) or never recorded (its stream has the error)
        try:
            self.backend.wait_event(self._stream(sid), recorded[0])
        except BaseException as error:
            self._failed(sid, error)

    def _event_done(self, op: tuple[Any, ...]) -> None:
        _, call, eid = op
        recorded = self.events.get(eid)
        if recorded is None or recorded[0] is None:
            self._send((Op.REPLY, call, True))
            return
        event = recorded[0]
        self._answer(call, lambda: self.backend.event_done(event))

    def _notify(self, op: tuple[Any, ...]) -> None:
        _, nid, sid = op
        try:
            self.backend.notify(self._stream(sid), self._notified(nid))
        except BaseException as error:
            self._notified(nid)()  # a waiter must wake; its next wait sees the error
            self._failed(sid, error)

    def _notify_event(self, op: tuple[Any, ...]) -> None:
        _, nid, eid, sid = op
        recorded = self.events.get(eid)
        if recorded is None or recorded[0] is None:  # gone (or failed): the stream's order
            self._notify((Op.NOTIFY, nid, sid))  # decides, never a claim made early
            return
        event, notified = recorded[0], self._notified(nid)

        def host_function() -> None:  # in the stream's order
            try:
                self.backend.notify_event(event, self._stream(sid), notified)
            except BaseException as error:
                notified()
                self._failed(sid, error)

        if self.watcher is not None:
            self.watcher.watch(event, notified, host_function)
        else:
            host_function()

    def _drop_queued(self, op: tuple[Any, ...]) -> None:
        _, call, sid = op

        def drop() -> None:
            stream = self._stream(sid)
            if stream is not None:
                self.backend.drop_queued(stream)

        self._answer(call, drop)

    def _sync_event(self, op: tuple[Any, ...]) -> None:
        _, call, eid = op

        def synchronize() -> None:
            recorded = self.events.get(eid)
            if recorded is None:
                raise LaunchArgumentMismatch(f"event {eid} is not a live event")
            event, sid, index = recorded
            if event is not None:
                self.backend.synchronize_event(event)
            self._raise_kept(sid, before=index)

        recorded = self.events.get(eid)
        if recorded is None or self._over(recorded[0]):
            self._answer(call, synchronize)  # nothing to wait for: no thread hop
        else:
            self._blocking(call, synchronize)

    def _destroy_event(self, op: tuple[Any, ...]) -> None:
        recorded = self.events.pop(op[1], None)
        if recorded is not None and recorded[0] is not None:
            if self.watcher is not None:  # one it watches goes once the watch ends
                self.watcher.destroy(recorded[0])
            else:
                self.backend.destroy_event(recorded[0])

    # -- copies -----------------------------------------------------------------------------------

    def _write(self, op: tuple[Any, ...]) -> None:
        _, call, bid, offset, total, sid, chunk = op
        if len(chunk) == total:
            self._start_write(call, bid, offset, sid, chunk)
            return
        staging = bytearray(total)
        staging[: len(chunk)] = chunk
        self._writes[call] = [staging, len(chunk), bid, offset, sid]

    def _write_more(self, op: tuple[Any, ...]) -> None:
        _, call, chunk = op
        pending = self._writes[call]
        staging, filled = pending[0], pending[1]
        staging[filled : filled + len(chunk)] = chunk
        pending[1] = filled + len(chunk)
        if pending[1] >= len(staging):
            del self._writes[call]
            self._start_write(call, pending[2], pending[3], pending[4], staging)

    def _start_write(self, call: int, bid: int, offset: int, sid: int | None, data: Any) -> None:
        def write() -> None:
            self.backend.write(self._buffer(bid), offset, data, self._stream(sid))
            self._raise_kept(sid)

        self._blocking(call, write)

    def _read(self, op: tuple[Any, ...]) -> None:
        _, call, bid, offset, size, sid = op

        def read() -> None:
            data = memoryview(self.backend.read(self._buffer(bid), offset, size, self._stream(sid)))
            self._raise_kept(sid)
            for start in range(0, size, CHUNK_BYTES):
                chunk = pickle.PickleBuffer(data[start : start + CHUNK_BYTES])
                self._send((Op.DATA, call, chunk))

        self._blocking(call, read)

    # -- shared host memory (``served_pins``) -----------------------------------------------------

    def _pin(self, op: tuple[Any, ...]) -> None:
        _, call, hid, pid, fd, size, dev, ino = op
        self._blocking(call, lambda: self.shared.pin(hid, pid, fd, size, dev, ino))

    def _unpin(self, op: tuple[Any, ...]) -> None:
        _, call, hid = op
        self._blocking(call, lambda: self.shared.unpin(hid))

    def _write_shared(self, op: tuple[Any, ...]) -> None:
        _, call, bid, offset, sid, hid, start, size = op

        def write() -> None:
            with self.shared.get(hid).part(start, size) as part:
                self.backend.write(self._buffer(bid), offset, part, self._stream(sid))
            self._raise_kept(sid)

        self._blocking(call, write)

    def _read_shared(self, op: tuple[Any, ...]) -> None:
        _, call, bid, offset, sid, hid, start, size = op

        def read() -> None:
            with self.shared.get(hid).part(start, size) as part:
                self.backend.read_into(self._buffer(bid), offset, part, self._stream(sid))
            self._raise_kept(sid)

        self._blocking(call, read)
