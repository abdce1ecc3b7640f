"""``WorkerBackend``: the ``Backend`` protocol served by a device worker in a child process.

The daemon uses it as it uses an in-process backend; a sticky fault then kills
one worker, not the daemon. Handles are made here, with ids chosen here, so
one-way ops need no answer. What differs from an in-process backend:

- **Batching.** ``launch``, prepared replays, ``wait_event``, frees and
  ``destroy_*`` are appended to a batch. The batch goes to the worker as one
  frame at ``record_event`` (every daemon launch ends with one: one write per
  launch), at ``notify``/``notify_event`` (a callback nobody sent would never
  run), and before any round trip. Ops keep the
  order they were made in; a frame is sent under the same lock its ops were
  appended under, so each stream's order is the callers' order.
- **Errors of one-way ops** (a launch the worker refuses: a freed buffer, an
  unloaded kernel, a dead stream) are not raised by that call. They are raised,
  once, by the next ``synchronize`` of that stream or of the whole device, the
  next ``synchronize_event`` of an event recorded on that stream after the
  failed op, or the next ``write``/``read``/``read_into`` on that stream.
  ``event_done``/``wait_event_for`` count such work as over. Round trips raise
  their own errors, with the worker's class, message and fields.
- **Faults.** A ``DeviceFault`` in the worker ends it. From then on (and after
  the worker dies for any reason) every call raises ``DeviceFault("the device
  worker for device N (kind) faulted: <reason>")``, except the frees (``destroy``,
  ``destroy_event``, ``destroy_stream``, ``drop_queued``, ``unpin_host``, closing
  artifacts and prepared launches), ``close``, ``memory_in_use`` and the
  identity properties; ``wait_event_for`` returns True and ``event_done``
  raises. Calls waiting are woken with the fault, registered notifications all
  run, and ``on_fault`` is called once, on the reader thread.
- **Host memory.** The worker cannot see the front's memory: ``pin_host``
  returns a token and pins nothing, and every copy carries its bytes over the
  channel (in 1 MiB frames; ``read_into`` lands them in ``out`` on the reader thread).
- **Callbacks** of ``notify``/``notify_event`` run on the channel's reader
  thread and must not call back into this backend.

Thread-safe: the daemon's event loop, device-work threads and ring submitter
call it at once. A ``weakref.finalize`` kills the worker if this object is dropped
unclosed.
"""

from __future__ import annotations

import contextlib
import itertools
import pickle
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accyd.backends.base import (
    BUFFER_ALIGNMENT,
    ArtifactRequest,
    BackendKind,
    CompiledArtifact,
    DeviceBuffer,
    Event,
    LaunchRequest,
    LoadedKernel,
    PreparedLaunch,
    Stream,
)
from accyd.backends.host_streams import call_quietly
from accyd.catalog.dtypes import DType
from accyd.catalog.model import ArtifactFormat
from accyd.errors import (
    DeviceFault,
    LaunchArgumentMismatch,
    RuntimeUnavailable,
    Unavailable,
    UnsupportedOperation,
)
from accyd.workers.channel import Channel
from accyd.workers.handles import (
    EventState,
    RemoteArtifact,
    RemotePrepared,
    Track,
    launch_fields,
    stream_id,
)
from accyd.workers.protocol import ALL_STREAMS, CHUNK_BYTES, Op
from accyd.workers.spawn import WorkerCommand, spawn_worker

__all__ = ["WorkerBackend"]


class WorkerBackend:
    """One device's backend in a worker process (see the module doc for what differs).

    Owns the worker process and its channel: ``close()`` (idempotent) asks the
    worker to free everything and exit, and kills it past ``close_timeout``;
    ``kill()`` ends it at once. Buffers, kernels, streams and events are owned by
    their callers as with any backend and freed through it; the worker frees them
    in the order the frees were made, after the ops sent before them.
    """

    def __init__(
        self,
        kind: str,
        device: int = 0,
        *,
        cache_dir: Path | None = None,
        host_memory_limit: int | None = None,
        on_fault: Callable[[DeviceFault], None] | None = None,
        start_timeout: float | None = 60.0,
        log_format: str = "console",
        log_level: str = "info",
        close_timeout: float = 5.0,
    ) -> None:
        """Start the worker; with ``start_timeout`` (seconds), wait until it is ready
        (``None``: return at once and call ``wait_ready`` later)."""
        if kind not in ("cuda", "host"):
            raise UnsupportedOperation(f"a device worker runs a cuda or host backend, not {kind!r}")
        self.device = device
        self.close_timeout = close_timeout
        command = WorkerCommand(kind, device, cache_dir, host_memory_limit, log_format, log_level)
        process, sock = spawn_worker(command)
        self._channel = Channel(
            process, sock, f"the device worker for device {device} ({kind})", on_fault
        )
        self._finalizer = weakref.finalize(self, self._channel.kill)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._buffers: dict[int, int] = {}
        self._kernels: set[int] = set()
        self._in_use = 0
        self._default = Track()
        self._tracks: dict[int, Track] = {}
        self._kind = BackendKind(kind)
        self._formats: frozenset[ArtifactFormat] = frozenset()
        self._name = ""
        if start_timeout is not None:
            self.wait_ready(start_timeout)

    # -- the worker ------------------------------------------------------------------------------

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until the worker made its backend; raise the worker's error if it could not
        (for example ``RuntimeUnavailable``: no such device), after killing it on a timeout."""
        info = self._channel.wait_ready(timeout)
        self._kind = BackendKind(info["kind"])
        self._formats = frozenset(ArtifactFormat(value) for value in info["formats"])
        self._name = info["device_name"]

    @property
    def pid(self) -> int:
        return self._channel.process.pid

    @property
    def fault(self) -> DeviceFault | None:
        """Why the worker is lost, once it is (None while it serves, or after ``close``)."""
        return self._channel.fault

    @property
    def reaped(self) -> bool:
        """Whether the worker process has exited and been waited for."""
        return self._channel.process.returncode is not None

    @property
    def returncode(self) -> int | None:
        """The worker's exit status once reaped (``-9``: killed; 75: it faulted)."""
        return self._channel.process.returncode

    @property
    def alive(self) -> bool:
        """Whether calls still reach the worker: ready, not faulted, not closed."""
        return self._channel.ready.is_set() and not self._channel.dead

    def kill(self) -> None:
        """End the worker now (SIGKILL), without reporting a fault; idempotent."""
        self._channel.kill()
        self._finalizer.detach()

    def close(self) -> None:
        """Ask the worker to free everything and exit; kill it past ``close_timeout`` s."""
        self._channel.close(self.close_timeout)
        self._finalizer.detach()

    def _ready(self) -> None:
        if not self._channel.ready.is_set():
            self.wait_ready()

    # -- identity --------------------------------------------------------------------------------

    @property
    def kind(self) -> BackendKind:
        """The worker's backend kind (cuda or host), so the daemon treats it the same."""
        self._ready()
        return self._kind

    @property
    def formats(self) -> frozenset[ArtifactFormat]:
        self._ready()
        return self._formats

    @property
    def device_name(self) -> str:
        self._ready()
        return self._name

    # -- memory and kernels ----------------------------------------------------------------------

    def allocate_buffer(
        self,
        byte_size: int,
        *,
        alignment: int = BUFFER_ALIGNMENT,
        dtype: DType | None = None,
        element_count: int | None = None,
        zero: bool = False,
    ) -> DeviceBuffer:
        """A round trip; ``address`` is the worker's real device address."""
        bid = next(self._ids)
        address = self._channel.call(lambda c: (Op.ALLOCATE, c, bid, byte_size, alignment, zero))
        with self._lock:
            self._buffers[bid] = byte_size
            self._in_use += byte_size
        return DeviceBuffer(bid, self._kind, byte_size, address, dtype, element_count)

    def create_artifact(self, request: ArtifactRequest) -> CompiledArtifact:
        """Compiled in the worker (a round trip); the artifact names the worker's copy."""
        aid = next(self._ids)
        self._channel.call(lambda c: (Op.CREATE_ARTIFACT, c, aid, request))
        return RemoteArtifact(request, aid, self._channel)

    def load_artifact(self, artifact: CompiledArtifact) -> LoadedKernel:
        if not isinstance(artifact, RemoteArtifact) or artifact.channel is not self._channel:
            raise RuntimeUnavailable(
                f"{artifact.kernel_name}: the artifact was not compiled by this device worker"
            )
        aid = artifact.image
        if artifact.closed or aid is None:
            raise RuntimeUnavailable(f"{artifact.kernel_name}: the artifact is closed")
        kid = next(self._ids)
        self._channel.call(lambda c: (Op.LOAD, c, aid, kid))
        with self._lock:
            self._kernels.add(kid)
        return LoadedKernel(kid, artifact.kernel_name)

    def destroy(self, obj: DeviceBuffer | LoadedKernel) -> None:
        """One-way; a second destroy of a handle, or one after a fault, does nothing."""
        if isinstance(obj, DeviceBuffer):
            with self._lock:
                size = self._buffers.pop(obj.id, None)
                if size is None:
                    return
                self._in_use -= size
            self._channel.post_quietly((Op.DESTROY_BUFFER, obj.id))
        elif isinstance(obj, LoadedKernel):
            with self._lock:
                if obj.id not in self._kernels:
                    return
                self._kernels.discard(obj.id)
            self._channel.post_quietly((Op.DESTROY_KERNEL, obj.id))
        else:
            raise UnsupportedOperation(f"cannot destroy {type(obj).__name__}")

    def memory_in_use(self) -> int:
        """Bytes of this backend's live buffers, counted here: no round trip, even after a fault."""
        return self._in_use

    # -- launches --------------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> None:
        """One-way: sent with the next flush (``record_event`` at the latest)."""
        self._channel.post((Op.LAUNCH, stream_id(request.stream), *launch_fields(request)))

    def prepare(self, requests: Sequence[LaunchRequest]) -> PreparedLaunch:
        """Prepared in the worker (a round trip: a CUDA graph there); replays are one-way."""
        pid = next(self._ids)
        launches = tuple((stream_id(r.stream), *launch_fields(r)) for r in requests)
        self._channel.call(lambda c: (Op.PREPARE, c, pid, launches))
        return RemotePrepared(self._channel, pid)

    # -- streams and events ----------------------------------------------------------------------

    def _track(self, stream: Stream | None) -> Track:
        if stream is None:
            return self._default
        track = stream.native
        if not isinstance(track, Track):
            raise LaunchArgumentMismatch(f"stream {stream.id} is not a stream of this worker")
        return track

    def synchronize(self, stream: Stream | None = None) -> None:
        if stream is None:
            with self._lock:
                tracks = [self._default, *self._tracks.values()]
            marks = [(track, track.recorded) for track in tracks]
            sid: int | None = ALL_STREAMS
        else:
            track = self._track(stream)
            marks = [(track, track.recorded)]
            sid = stream.id
        self._waited(lambda c: (Op.SYNCHRONIZE, c, sid), marks)

    def _waited(
        self, build: Callable[[int], tuple[Any, ...]], marks: Sequence[tuple[Track, int]], **kw: Any
    ) -> Any:
        """A round trip that waits for work: afterwards (failed or not) that work is over."""
        try:
            result = self._channel.call(build, **kw)
        except (DeviceFault, Unavailable):
            raise
        except Exception:
            for track, upto in marks:
                track.advance(upto)
            raise
        for track, upto in marks:
            track.advance(upto)
        return result

    def create_stream(self) -> Stream:
        """A round trip (the worker makes the stream before anything names it)."""
        sid = next(self._ids)
        self._channel.call(lambda c: (Op.CREATE_STREAM, c, sid))
        track = Track()
        with self._lock:
            self._tracks[sid] = track
        return Stream(sid, track)

    def destroy_stream(self, stream: Stream) -> None:
        with self._lock:
            if self._tracks.pop(stream.id, None) is None:
                return
        self._channel.post_quietly((Op.DESTROY_STREAM, stream.id))

    def record_event(self, stream: Stream | None) -> Event:
        """One-way, and the flush: the batch (this launch's ops) goes as one frame."""
        track, sid = self._track(stream), stream_id(stream)
        eid = next(self._ids)
        seq = self._channel.flush((Op.RECORD, eid, sid), track)
        return Event(eid, EventState(track, seq, sid))

    @staticmethod
    def _state(event: Event) -> EventState:
        state = event.native
        if not isinstance(state, EventState):
            raise LaunchArgumentMismatch(f"event {event.id} is not an event of this worker")
        return state

    def wait_event(self, stream: Stream | None, event: Event) -> None:
        """One-way; nothing at all when the event is known over already."""
        if not self._state(event).known_done():
            self._channel.post((Op.WAIT_EVENT, stream_id(stream), event.id))
        elif self._channel.dead:
            raise self._channel.dead_error()

    def event_done(self, event: Event) -> bool:
        """Answered here when the front knows; else a round trip (the worker does not block)."""
        channel = self._channel
        if channel.dead:
            raise channel.dead_error()
        state = self._state(event)
        if state.known_done():
            return True
        done = bool(channel.call(lambda c: (Op.EVENT_DONE, c, event.id)))
        if done:
            state.track.advance(state.seq)
        return done

    def wait_event_for(self, event: Event, seconds: float) -> bool:
        """A notification registered once per event, waited for here: True at once when the
        work is known over, the event failed, or the worker is lost."""
        state = self._state(event)
        if self._channel.dead or state.known_done():
            return True
        waiter = state.waiter
        if waiter is None:
            with self._lock:
                waiter = state.waiter
                fresh = waiter is None
                if waiter is None:
                    waiter = state.waiter = threading.Event()
            if fresh:
                try:
                    self._notify_event(event.id, state, waiter.set)
                except (DeviceFault, Unavailable):
                    return True
        return waiter.wait(seconds) or state.known_done() or self._channel.dead

    def _notify_event(self, eid: int, state: EventState, callback: Callable[[], None]) -> None:
        """Register ``callback`` for the event's work, on the stream it was recorded on."""
        track, seq = state.track, state.seq

        def reached() -> None:
            track.advance(seq)
            callback()

        nid = self._channel.watch(reached)
        self._channel.flush((Op.NOTIFY_EVENT, nid, eid, state.sid))

    def notify(self, stream: Stream | None, callback: Callable[[], None]) -> None:
        """Flushes; ``callback`` runs on the reader thread once the stream's work so far is over."""
        track = self._track(stream)
        upto = track.recorded

        def reached() -> None:
            track.advance(upto)
            callback()

        nid = self._channel.watch(reached)
        self._channel.flush((Op.NOTIFY, nid, stream_id(stream)))

    def notify_event(
        self, event: Event, stream: Stream | None, callback: Callable[[], None]
    ) -> None:
        """At once (on this thread) when the event is known over; else on the reader thread
        once it is (``stream`` is ignored: the event names the stream it was recorded on)."""
        state = self._state(event)
        channel = self._channel
        if channel.dead:
            raise channel.dead_error()
        if state.known_done():
            call_quietly(callback)
            return
        self._notify_event(event.id, state, callback)

    def drop_queued(self, stream: Stream) -> None:
        """A round trip (rare: at a detach), so kernels not started by its return are dropped,
        as in-process. Nothing after a fault: nothing is queued in a dead worker."""
        if not self._channel.dead:
            with contextlib.suppress(DeviceFault, Unavailable):
                self._channel.call(lambda c: (Op.DROP_QUEUED, c, stream.id))

    def synchronize_event(self, event: Event) -> None:
        state = self._state(event)
        self._waited(lambda c: (Op.SYNC_EVENT, c, event.id), [(state.track, state.seq)])

    def destroy_event(self, event: Event) -> None:
        self._channel.post_quietly((Op.DESTROY_EVENT, event.id))

    # -- copies ----------------------------------------------------------------------------------

    def write(
        self, buffer: DeviceBuffer, offset: int, data: bytes | memoryview, stream: Stream | None
    ) -> None:
        """A round trip carrying ``data`` (in 1 MiB frames); done on return."""
        view = memoryview(data)
        if not view.c_contiguous:
            view = memoryview(view.tobytes())
        view = view.cast("B") if view.ndim != 1 or view.format != "B" else view
        total = view.nbytes
        track = self._track(stream)
        sid, bid = stream_id(stream), buffer.id
        first = pickle.PickleBuffer(view[:CHUNK_BYTES])

        def more(c: int) -> Iterator[tuple[Any, ...]]:
            for start in range(CHUNK_BYTES, total, CHUNK_BYTES):
                yield (Op.WRITE_MORE, c, pickle.PickleBuffer(view[start : start + CHUNK_BYTES]))

        self._waited(
            lambda c: (Op.WRITE, c, bid, offset, total, sid, first),
            [(track, track.recorded)],
            more=more,
        )

    def read(self, buffer: DeviceBuffer, offset: int, size: int, stream: Stream | None) -> bytes:
        """A round trip; the bytes come in 1 MiB frames."""
        chunks: list[bytes] = []
        self._read(buffer, offset, size, stream, chunks.append)
        if len(chunks) == 1 and type(chunks[0]) is bytes:
            return chunks[0]
        return b"".join(chunks)  # frames past 256 KiB arrive as views of their own buffer

    def read_into(
        self, buffer: DeviceBuffer, offset: int, out: bytearray | memoryview, stream: Stream | None
    ) -> None:
        """A round trip; each frame's bytes are copied into ``out`` on the reader thread."""
        view = memoryview(out)
        if view.readonly or not view.c_contiguous:
            raise LaunchArgumentMismatch("read_into needs a writable, C-contiguous buffer")
        target = view.cast("B") if view.ndim != 1 or view.format != "B" else view
        filled = [0]

        def sink(chunk: bytes) -> None:
            start = filled[0]
            target[start : start + len(chunk)] = chunk
            filled[0] = start + len(chunk)

        self._read(buffer, offset, target.nbytes, stream, sink)

    def _read(
        self,
        buffer: DeviceBuffer,
        offset: int,
        size: int,
        stream: Stream | None,
        sink: Callable[[bytes], None],
    ) -> None:
        track = self._track(stream)
        sid, bid = stream_id(stream), buffer.id
        self._waited(
            lambda c: (Op.READ, c, bid, offset, size, sid), [(track, track.recorded)], sink=sink
        )

    def pin_host(self, memory: memoryview) -> object:
        """Nothing to pin: the worker cannot see this memory (copies carry the bytes)."""
        return _Unpinned()

    def unpin_host(self, pinned: object) -> None:
        return None

    def __repr__(self) -> str:
        state = "lost" if self._channel.fault else ("closed" if self._channel.dead else "serving")
        return f"WorkerBackend(device {self.device}, {self._kind.value}, pid {self.pid}, {state})"


class _Unpinned:
    """What ``WorkerBackend.pin_host`` returns: a token, nothing pinned."""

    __slots__ = ()


if TYPE_CHECKING:
    from accyd.backends.base import Backend

    _conforms: type[Backend] = WorkerBackend
