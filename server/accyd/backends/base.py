"""The one typed protocol every backend implements, and the handles it hands out.

Backends know nothing of clients, sessions or pipelines: they allocate, free,
compile, load, launch, copy, stream, event and synchronize. Every handle is
made only by its backend and freed only through it; handles carry an ``id``
unique within their backend, which the executor uses to tell buffers apart.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from accyd.backends.partitions import PartitionSpec, SmSplit
from accyd.catalog.dtypes import DType, Scalar
from accyd.catalog.model import ArtifactFormat, FixedGeometry, Param

__all__ = [
    "ArtifactRequest",
    "Backend",
    "BackendKind",
    "CompiledArtifact",
    "DeviceBuffer",
    "Event",
    "ExportKind",
    "Exported",
    "LaunchRequest",
    "LoadedKernel",
    "PreparedLaunch",
    "ScalarChange",
    "SequentialLaunch",
    "Stream",
    "round_up",
    "with_scalars",
]

BUFFER_ALIGNMENT = 256


class BackendKind(enum.Enum):
    CUDA = "cuda"
    HOST = "host"
    RECORDING = "recording"
    """The test double in ``accyd.testing``."""


@dataclass(eq=False, slots=True)
class DeviceBuffer:
    """A buffer in the backend's memory, made by ``Backend.allocate_buffer``.

    The backend owns the memory; whoever asked for the buffer frees it with
    ``Backend.destroy`` once no queued work still uses it. ``address`` is the
    device pointer (CUDA) or 0; ``native`` is the backend's own object.
    """

    id: int
    backend: BackendKind
    byte_size: int
    address: int = 0
    dtype: DType | None = None
    element_count: int | None = None
    native: Any = field(default=None, repr=False)

    def aliases(self, other: DeviceBuffer) -> bool:
        return self.backend is other.backend and self.id == other.id


class ExportKind(enum.Enum):
    CUDA_VMM = "cuda_vmm"
    """A VMM allocation's POSIX descriptor (``cuMemExportToShareableHandle``)."""
    HOST_MEMFD = "host_memfd"
    """A memfd the host backend keeps the buffer in."""


@dataclass(frozen=True, slots=True)
class Exported:
    """What ``Backend.export_buffer`` hands out: a new descriptor the caller owns and closes.

    Mapping all ``mapping_size`` bytes of ``fd`` shows the buffer at ``offset``. The
    descriptor keeps the memory alive, so it must be closed once handed on.
    """

    fd: int
    kind: ExportKind
    mapping_size: int
    offset: int
    gpu_uuid: bytes = b""


EXPORT_GRANULE = 2 << 20
"""What an exportable buffer is charged in whole multiples of: CUDA's VMM granularity."""


def round_up(size: int, step: int) -> int:
    r"""``size`` rounded up to a whole number of ``step``\ s."""
    return -(-size // step) * step


@dataclass(eq=False, slots=True, weakref_slot=True)
class Stream:
    """An ordered queue of device work. Made by ``create_stream``, freed by ``destroy_stream``."""

    id: int
    native: Any = field(default=None, repr=False)
    partition: str | None = None
    """The SM partition its kernels are confined to (``None``: the whole device)."""


@dataclass(eq=False, slots=True)
class Event:
    """A point in a stream, made by ``record_event`` and freed by ``destroy_event``."""

    id: int
    native: Any = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class ArtifactRequest:
    """What ``create_artifact`` compiles: one registry entry's kernel."""

    kernel_name: str
    format: ArtifactFormat
    argument_count: int
    scalar_argument_count: int
    payload: str | bytes
    required_dtypes: tuple[DType, ...] = ()
    required_features: tuple[str, ...] = ()
    origin: str = "<memory>"
    diagnostic_id: str | None = None
    params: tuple[Param, ...] = ()
    """The kernel's parameters in its own order; empty: buffers, then scalars."""
    compile_options: tuple[str, ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    images: tuple[tuple[int, bytes], ...] = ()
    arch: int | None = None
    source_name: str = "kernel.cu"
    """The source's file name, as compile errors name it."""


class CompiledArtifact:
    """A compiled kernel image, not yet loaded. Made by ``Backend.create_artifact``.

    The caller owns it and calls ``close()`` (idempotent) once it has been
    loaded or is no longer needed; a loaded kernel does not need it to stay open.
    """

    def __init__(self, request: ArtifactRequest, image: Any) -> None:
        self.kernel_name = request.kernel_name
        self.format = request.format
        self.argument_count = request.argument_count
        self.scalar_argument_count = request.scalar_argument_count
        self.origin = request.origin
        self.request = request
        self.image: Any = image
        self.closed = False

    def buffer_argument_count(self) -> int:
        return self.argument_count - self.scalar_argument_count

    def close(self) -> None:
        self.image = None
        self.closed = True


@dataclass(eq=False, slots=True)
class LoadedKernel:
    """A kernel loaded into the backend, ready to launch. Freed by ``Backend.destroy``."""

    id: int
    kernel_name: str
    native: Any = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    """One kernel launch: buffers then scalars, in the kernel's argument order."""

    artifact: CompiledArtifact | None
    loaded: LoadedKernel
    buffers: Sequence[DeviceBuffer]
    scalars: Sequence[Scalar]
    geometry: FixedGeometry
    stream: Stream | None = None
    shared_memory_bytes: int = 0
    diagnostic_id: str | None = None


ScalarChange = tuple[int, int, Scalar]
"""A prepared launch's stage (by index), a position among that stage's scalars, its new value."""


def with_scalars(
    requests: tuple[LaunchRequest, ...], changes: Sequence[ScalarChange]
) -> tuple[LaunchRequest, ...] | None:
    """``requests`` given ``changes`` (a changed request is a new one), or ``None`` where each
    value is the one it has (as a kernel sees it: ``Scalar.same_as``)."""
    out = list(requests)
    for stage, position, value in changes:
        scalars = list(out[stage].scalars)
        if not scalars[position].same_as(value):
            scalars[position] = value
            out[stage] = dataclasses.replace(out[stage], scalars=tuple(scalars))
    if all(new is old for new, old in zip(out, requests, strict=True)):
        return None
    return tuple(out)


class PreparedLaunch(Protocol):
    """Launches checked and packed once, replayed many times: a CUDA graph on the device.

    Made by ``Backend.prepare``; its owner closes it before freeing any buffer
    its requests named.
    """

    def launch(self, stream: Stream | None, count: int = 1) -> None:
        """Enqueue the launches ``count`` times on ``stream``, in its order."""
        ...

    def set_scalars(self, changes: Sequence[ScalarChange]) -> None:
        """Give some stages' scalars new values for the launches enqueued from now on (those
        enqueued already keep theirs). Only where the backend's ``prepared_takes_scalars``;
        the caller checked each value, and that no grid, size or bound depends on it."""
        ...

    def close(self) -> None: ...


class SequentialLaunch:
    """A prepared launch for a backend without graphs: its requests one after another."""

    def __init__(self, backend: Backend, requests: Sequence[LaunchRequest]) -> None:
        self._backend = backend
        self._requests = tuple(requests)
        self._on: tuple[Stream | None, tuple[LaunchRequest, ...]] = (None, ())

    def launch(self, stream: Stream | None, count: int = 1) -> None:
        on, requests = self._on
        if on is not stream or not requests:
            requests = tuple(dataclasses.replace(r, stream=stream) for r in self._requests)
            self._on = (stream, requests)
        launch = self._backend.launch
        for _ in range(count):
            for request in requests:
                launch(request)

    def set_scalars(self, changes: Sequence[ScalarChange]) -> None:
        requests = with_scalars(self._requests, changes)
        if requests is not None:
            self._requests = requests
            self._on = (None, ())

    def close(self) -> None:
        self._on = (None, ())


@runtime_checkable
class Backend(Protocol):
    """Allocate, compile, load, launch, copy and synchronize on one device.

    Work given a ``stream`` runs in that stream's order; ``stream=None`` means the
    backend's default stream. Errors are domain errors (``accyd.errors``):
    ``OutOfMemory`` for allocations, ``RuntimeUnavailable`` for compile and load,
    ``LaunchFailed`` for launches and copies, ``DeviceFault`` when the device is
    poisoned and the process must restart.
    """

    @property
    def kind(self) -> BackendKind: ...

    @property
    def prepared_takes_scalars(self) -> bool:
        """Whether ``prepare``'s launches take new values of their scalars (``set_scalars``):
        then one prepared launch serves every value of a scalar no check reads."""
        ...

    @property
    def formats(self) -> frozenset[ArtifactFormat]:
        """The artifact formats this backend can load."""
        ...

    @property
    def device_name(self) -> str: ...

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
        """A new buffer; ``zero`` fills it with zeros before it is returned.

        Memory is reused between clients, so a buffer a client can read must be
        zeroed (or fully written) first, or it may show another client's data.
        ``exportable`` makes memory ``export_buffer`` can hand to another process
        (``UnsupportedOperation`` where the backend has none).
        """
        ...

    def export_buffer(self, buffer: DeviceBuffer) -> Exported:
        """A new descriptor of an exportable ``buffer``'s memory, for another process to map.

        The memory lives while any process maps it, so freeing the buffer later never
        lets its pages be reused under a mapping. ``FailedPrecondition`` for a buffer
        not allocated exportable."""
        ...

    def create_artifact(self, request: ArtifactRequest) -> CompiledArtifact: ...

    def load_artifact(self, artifact: CompiledArtifact) -> LoadedKernel: ...

    def launch(self, request: LaunchRequest) -> None: ...

    def prepare(self, requests: Sequence[LaunchRequest]) -> PreparedLaunch:
        """Check and pack ``requests`` once (in order, on one stream) for many launches."""
        ...

    def destroy(self, obj: DeviceBuffer | LoadedKernel) -> None:
        """Free a buffer or unload a kernel. The caller ensures no queued work uses it."""
        ...

    def synchronize(self, stream: Stream | None = None) -> None:
        """Wait for ``stream``'s work, or for all the device's work when ``None``."""
        ...

    def create_stream(self, partition: str | None = None, priority: int = 0) -> Stream:
        """A new stream, its kernels confined to ``partition`` (one ``split_sms`` made;
        ``None``: the whole device), at ``priority`` (0 the default; higher runs first where
        the device has a choice, never preempting running work; a backend without
        priorities ignores it)."""
        ...

    def split_sms(self, specs: Sequence[PartitionSpec]) -> SmSplit:
        """Split the device's SMs into ``specs``' partitions, once, before any stream is made
        in one (``backends/partitions.py``); a backend that cannot says why in the result
        and makes none."""
        ...

    def destroy_stream(self, stream: Stream) -> None: ...

    def record_event(self, stream: Stream | None) -> Event: ...

    def wait_event(self, stream: Stream | None, event: Event) -> None:
        """Make later work on ``stream`` wait for ``event`` without blocking the host."""
        ...

    def event_done(self, event: Event) -> bool: ...

    def wait_event_for(self, event: Event, seconds: float) -> bool:
        """Block at most ``seconds`` for the work before ``event``; whether it finished.

        For waits short enough to spend on the calling thread (the event loop):
        it returns ``True`` for work that failed too, and the next full wait
        (``synchronize_event``) reports the error.
        """
        ...

    def notify(self, stream: Stream | None, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the work enqueued on ``stream`` so far has finished.

        It runs on another thread (the backend's or the driver's), must be quick
        and must not call the backend; errors are reported by the next wait, not
        to it. A stream whose device was lost may never call it: a waiter keeps
        a blocking wait as its fallback.
        """
        ...

    def notify_event(
        self, event: Event, stream: Stream | None, callback: Callable[[], None]
    ) -> None:
        """Call ``callback()`` once the work before ``event`` (recorded on ``stream``) is over.

        As ``notify``: from another thread, quick, calling no backend. A backend
        may call it later (once the stream's work so far is over), never earlier.
        """
        ...

    def drop_queued(self, stream: Stream) -> None:
        """Skip the kernels queued on ``stream`` that have not started; for a stream about
        to be destroyed. Events and notifications on it still complete. A backend that
        cannot take back what it handed to the device runs them."""
        ...

    def synchronize_event(self, event: Event) -> None: ...

    def destroy_event(self, event: Event) -> None: ...

    def write(
        self, buffer: DeviceBuffer, offset: int, data: bytes | memoryview, stream: Stream | None
    ) -> None:
        """Copy ``data`` into ``buffer`` at ``offset``, in ``stream``'s order; done on return."""
        ...

    def read(self, buffer: DeviceBuffer, offset: int, size: int, stream: Stream | None) -> bytes:
        """Copy ``size`` bytes out of ``buffer``, in ``stream``'s order; done on return."""
        ...

    def read_into(
        self, buffer: DeviceBuffer, offset: int, out: bytearray | memoryview, stream: Stream | None
    ) -> None:
        """Copy ``len(out)`` bytes of ``buffer`` from ``offset`` into the writable, C-contiguous
        ``out``, in ``stream``'s order; done on return."""
        ...

    def pin_host(self, memory: memoryview, fd: int | None = None) -> object:
        """Page-lock the writable host ``memory`` so copies with it run at full speed; held
        until ``unpin_host`` (costly: done once per shared segment, never per copy).

        ``fd``, when given, is a descriptor of the file ``memory`` maps whole, from offset 0
        (a shared segment's memfd): a backend in another process maps the same memory
        through it, so copies with ``memory`` carry no bytes (``accyd.backends.worker``). In-process
        backends ignore it; the caller keeps it open until ``unpin_host``."""
        ...

    def unpin_host(self, pinned: object) -> None:
        """Undo ``pin_host`` (what it returned); no copy may use the memory meanwhile."""
        ...

    def memory_in_use(self) -> int:
        """Bytes of buffers this backend allocated and has not freed."""
        ...

    def close(self) -> None:
        """Free everything the backend still holds; idempotent."""
        ...
