"""``WorkerBackend``: the ``Backend`` protocol served by a device worker in a child process.

The daemon uses it as it uses an in-process backend; a sticky fault then kills
one worker, not the daemon. Handles are made here, with ids chosen here, so
one-way ops need no answer. What differs from an in-process backend:

- **Batching.** ``launch``, prepared replays, ``wait_event``, frees and
  ``destroy_*`` are appended to a batch. The batch goes to the worker as one
  frame at ``record_event`` (every daemon launch ends with one: one write per
  launch), at ``notify``/``notify_event`` (a callback nobody sent would never
  run), and before any round trip. Ops keep the order they were made in: a
  frame is sent under the lock its ops were appended under, and the worker
  runs one-way ops in frame order, so each stream's order is its callers'.
- **Round trips**: allocations, compiles, loads, ``prepare``, stream creation,
  synchronizations, copies and ``drop_queued``. ``event_done`` never is: it
  answers from what the front knows (see ``handles``: a synchronize, a copy or
  a notification that proved the work over) and its first ask of an event
  registers a notification, so a poll sees the work over soon after it is.
  ``wait_event_for`` waits here for that same notification.
- **Errors of one-way ops** (a launch the worker refuses: a freed buffer, an
  unloaded kernel, a dead stream) are not raised by that call. They are raised,
  once, by the next ``synchronize`` of that stream or of the whole device, the
  next ``synchronize_event`` of an event recorded on that stream after the
  failed op, or the next ``write``/``read``/``read_into`` on that stream; a
  wait that fails itself raises its own error first and leaves that one for
  the next. ``event_done``/``wait_event_for`` count such work as over. Round
  trips raise their own errors, with the worker's class, message and fields.
- **Faults.** A ``DeviceFault`` in the worker ends it. From then on (and after
  the worker dies for any reason) every call raises ``DeviceFault("the device
  worker for device N (kind) faulted: <reason>")``, except the frees (``destroy``,
  ``destroy_event``, ``destroy_stream``, ``drop_queued``, ``unpin_host``, closing
  artifacts and prepared launches), ``close``, ``memory_in_use`` and the
  identity properties; ``wait_event_for`` returns True and ``event_done``
  raises. Calls waiting are woken with the fault, registered notifications all
  run, and ``on_fault`` is called once, on the reader thread. The call whose
  work faulted raises the worker's own ``DeviceFault`` (the backend's message).
- **Host memory.** ``pin_host(memory, fd)`` with the descriptor of the file
  ``memory`` maps (a shared segment's memfd) has the worker map that file too
  and pin its own mapping (a round trip; ``accyd.backends.worker.front.pins``). A ``write``
  from, or a ``read_into`` into, a view wholly inside such memory then names
  (pin, offset, size) and carries no bytes: the worker copies from its mapping
  of the same pages. Every other copy carries its bytes over the channel
  (1 MiB frames; ``read_into`` lands them in ``out`` on the reader thread,
  ``read`` joins them into one ``bytes``), as do copies with memory pinned
  without ``fd``, or whose file the worker could not map (logged once).
  ``unpin_host`` unpins and unmaps in the worker (a round trip).
- **Callbacks** of ``notify``/``notify_event`` run on the channel's reader
  thread and must not call back into this backend.

Thread-safe: the daemon's event loop, device-work threads and ring submitter
call it at once. A ``weakref.finalize`` kills the worker if this object is dropped
unclosed.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from accyd.backends.base import (
    BUFFER_ALIGNMENT,
    ArtifactRequest,
    BackendKind,
    CompiledArtifact,
    DeviceBuffer,
    Event,
    Exported,
    ExportKind,
    LaunchRequest,
    LoadedKernel,
    PreparedLaunch,
    Stream,
)
from accyd.backends.partitions import PartitionSpec, SmSplit
from accyd.backends.worker.channel import Channel
from accyd.backends.worker.front.handles import (
    RemoteArtifact,
    RemotePrepared,
    launch_fields,
    stream_id,
)
from accyd.backends.worker.front.liveness import DEFAULT_HANG_SECONDS
from accyd.backends.worker.front.pins import (
    PinnedRange,
    PinnedRanges,
    address_of,
    file_identity,
    maps_file,
)
from accyd.backends.worker.front.spawn import WorkerCommand, spawn_worker
from accyd.backends.worker.front.streams import WorkerStreams
from accyd.backends.worker.protocol import Op
from accyd.catalog.dtypes import DType
from accyd.catalog.model import ArtifactFormat
from accyd.errors import (
    DeviceFault,
    RuntimeUnavailable,
    Unavailable,
    UnsupportedOperation,
)

__all__ = ["WorkerBackend"]

log = structlog.get_logger("accyd.backends.worker")

_IDS = itertools.count(1)
"""Handle ids, unique across every worker of this process: a stale handle of a replaced
worker names nothing in its successor (an error), never another of its buffers."""


def _kill(channel: Channel, lane: socket.socket) -> None:
    channel.kill()
    lane.close()


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
        name: str | None = None,
        hang_seconds: float | None = DEFAULT_HANG_SECONDS,
    ) -> None:
        """Start the worker on GPU (or host device) ``device``; with ``start_timeout``
        (seconds), wait until it is ready (``None``: return at once and call ``wait_ready``
        later). ``name``: what errors call the device (``device N`` by default).
        ``hang_seconds``: a worker silent that long is lost
        (``accyd.backends.worker.front.liveness``; ``None``: never)."""
        if kind not in ("cuda", "host"):
            raise UnsupportedOperation(f"a device worker runs a cuda or host backend, not {kind!r}")
        self.device = device
        self.close_timeout = close_timeout
        command = WorkerCommand(kind, device, cache_dir, host_memory_limit, log_format, log_level)
        process, sock, self._lane = spawn_worker(command)
        self._lane_lock = threading.Lock()
        self._channel = Channel(
            process,
            sock,
            f"the device worker for {name or f'device {device}'} ({kind})",
            on_fault,
            hang_seconds,
        )
        self._finalizer = weakref.finalize(self, _kill, self._channel, self._lane)
        self._ids = _IDS
        self._lock = threading.Lock()
        self._buffers: dict[int, int] = {}
        self._kernels: set[int] = set()
        self._in_use = 0
        self._kind = BackendKind(kind)
        self._formats: frozenset[ArtifactFormat] = frozenset()
        self._name = ""
        self._pins = PinnedRanges()
        self._streams = WorkerStreams(self._channel, self._ids, self._pins)
        self._front_pid = os.getpid()
        """Whose descriptors ``PIN`` names (the worker opens ``/proc/<pid>/fd/<fd>``)."""
        self._copying_bytes = False
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
        _kill(self._channel, self._lane)
        self._finalizer.detach()

    def close(self) -> None:
        """Ask the worker to free everything and exit; kill it past ``close_timeout`` s."""
        self._channel.close(self.close_timeout)
        self._lane.close()
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
    def prepared_takes_scalars(self) -> bool:
        return False  # the worker's prepared launches are replayed as they were made

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
        exportable: bool = False,
    ) -> DeviceBuffer:
        """A round trip; ``address`` is the worker's real device address."""
        bid = next(self._ids)
        address = self._channel.call(
            lambda c: (Op.ALLOCATE, c, bid, byte_size, alignment, zero, exportable)
        )
        with self._lock:
            self._buffers[bid] = byte_size
            self._in_use += byte_size
        return DeviceBuffer(bid, self._kind, byte_size, address, dtype, element_count)

    def export_buffer(self, buffer: DeviceBuffer) -> Exported:
        """A round trip; the worker's new descriptor comes over the lane, as our own."""
        with self._lane_lock:
            kind, size, offset, uuid = self._channel.call(lambda c: (Op.EXPORT, c, buffer.id))
            self._lane.settimeout(5.0)
            _, fds, _, _ = socket.recv_fds(self._lane, 1, 1)
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise self._channel.dead_error()
        return Exported(fds[0], ExportKind(kind), size, offset, uuid)

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

    # -- streams, events and copies (``WorkerStreams``: what the front knows of each stream) ---

    def synchronize(self, stream: Stream | None = None) -> None:
        self._streams.synchronize(stream)

    def create_stream(self, partition: str | None = None, priority: int = 0) -> Stream:
        return self._streams.create_stream(partition, priority)

    def split_sms(self, specs: Sequence[PartitionSpec]) -> SmSplit:
        return self._streams.split_sms(specs)

    def destroy_stream(self, stream: Stream) -> None:
        self._streams.destroy_stream(stream)

    def record_event(self, stream: Stream | None) -> Event:
        return self._streams.record_event(stream)

    def wait_event(self, stream: Stream | None, event: Event) -> None:
        self._streams.wait_event(stream, event)

    def event_done(self, event: Event) -> bool:
        return self._streams.event_done(event)

    def wait_event_for(self, event: Event, seconds: float) -> bool:
        return self._streams.wait_event_for(event, seconds)

    def notify(self, stream: Stream | None, callback: Callable[[], None]) -> None:
        self._streams.notify(stream, callback)

    def notify_event(
        self, event: Event, stream: Stream | None, callback: Callable[[], None]
    ) -> None:
        self._streams.notify_event(event, stream, callback)

    def drop_queued(self, stream: Stream) -> None:
        self._streams.drop_queued(stream)

    def synchronize_event(self, event: Event) -> None:
        self._streams.synchronize_event(event)

    def destroy_event(self, event: Event) -> None:
        self._streams.destroy_event(event)

    def write(
        self, buffer: DeviceBuffer, offset: int, data: bytes | memoryview, stream: Stream | None
    ) -> None:
        self._streams.write(buffer, offset, data, stream)

    def read(self, buffer: DeviceBuffer, offset: int, size: int, stream: Stream | None) -> bytes:
        return self._streams.read(buffer, offset, size, stream)

    def read_into(
        self, buffer: DeviceBuffer, offset: int, out: bytearray | memoryview, stream: Stream | None
    ) -> None:
        self._streams.read_into(buffer, offset, out, stream)

    # -- host memory ------------------------------------------------------------------------------

    def pin_host(self, memory: memoryview, fd: int | None = None) -> object:
        """With ``fd`` (the file ``memory`` maps whole, from offset 0): the worker maps that file
        and pins its mapping (a round trip), so copies within ``memory`` carry no bytes; its
        backend's errors (``OutOfMemory``...) are raised. Without ``fd``, when ``memory`` is
        not that file's mapping, or when the worker cannot map it: nothing is pinned and
        copies carry their bytes (the last two logged once)."""
        if fd is None:
            return _Unpinned()
        view = memoryview(memory)
        if not view.c_contiguous or view.nbytes == 0:
            return _Unpinned()
        view = view.cast("B") if view.ndim != 1 or view.format != "B" else view
        base, size = address_of(view), view.nbytes
        identity = file_identity(fd)
        if not maps_file(base, size, identity):
            self._copy_bytes(f"the memory is not descriptor {fd}'s file mapped from offset 0")
            return _Unpinned()
        hid, pid = next(self._ids), self._front_pid
        why = self._channel.call(
            lambda c: (Op.PIN, c, hid, pid, fd, size, identity.dev, identity.ino)
        )
        if why is not None:
            self._copy_bytes(f"the worker could not map it: {why}")
            return _Unpinned()
        pinned = PinnedRange(hid, base, base + size)
        self._pins.add(pinned)
        return pinned

    def _copy_bytes(self, why: str) -> None:
        if not self._copying_bytes:
            self._copying_bytes = True
            log.warning(
                "shared host memory is copied through the device worker's channel",
                worker=self._channel.name,
                reason=why,
            )

    def unpin_host(self, pinned: object) -> None:
        """A round trip that unpins and unmaps in the worker (after copies still using it);
        nothing after a fault or ``close``, or for memory pinned without ``fd``."""
        if not isinstance(pinned, PinnedRange) or not self._pins.remove(pinned):
            return
        if self._channel.dead:
            return
        hid = pinned.hid
        with contextlib.suppress(DeviceFault, Unavailable):
            self._channel.call(lambda c: (Op.UNPIN, c, hid))

    def __repr__(self) -> str:
        state = "lost" if self._channel.fault else ("closed" if self._channel.dead else "serving")
        return f"WorkerBackend(device {self.device}, {self._kind.value}, pid {self.pid}, {state})"


class _Unpinned:
    """What ``WorkerBackend.pin_host`` returns when nothing is pinned: a token."""

    __slots__ = ()


if TYPE_CHECKING:
    from accyd.backends.base import Backend

    _conforms: type[Backend] = WorkerBackend
