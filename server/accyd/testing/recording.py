"""A backend that records every call and injects failures, for tests.

It counts allocations, artifact creations, loads, launches, destroys and
synchronizations; records sizes, grids, scalars and buffer ids; and fails the
allocation, load or launch after a given count. Ids start at 1 and are shared
by every kind of object (docs/executor.md's tests). It runs no kernel and holds no memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from accyd.backends.base import (
    BUFFER_ALIGNMENT,
    ArtifactRequest,
    BackendKind,
    CompiledArtifact,
    DeviceBuffer,
    Event,
    Exported,
    LaunchRequest,
    LoadedKernel,
    PreparedLaunch,
    SequentialLaunch,
    Stream,
)
from accyd.backends.partitions import Partition, PartitionSpec, SmSplit, deal_groups
from accyd.catalog.dtypes import DType
from accyd.catalog.model import ArtifactFormat
from accyd.errors import (
    FailedPrecondition,
    LaunchFailed,
    OutOfMemory,
    RuntimeUnavailable,
    UnsupportedOperation,
)

__all__ = ["RecordingBackend"]


@dataclass(eq=False)
class RecordingBackend:
    """Implements ``Backend`` by counting; ``fail_*_after_count`` makes the next call fail."""

    format: ArtifactFormat = ArtifactFormat.CUDA_PTX
    fail_buffer_allocate_after_count: int | None = None
    fail_load_after_count: int | None = None
    fail_launch_after_count: int | None = None

    buffer_allocate_count: int = 0
    create_count: int = 0
    load_count: int = 0
    launch_count: int = 0
    destroy_count: int = 0
    synchronize_count: int = 0
    allocated_buffer_ids: list[int] = field(default_factory=list)
    allocated_buffer_byte_sizes: list[int] = field(default_factory=list)
    allocated_buffer_alignments: list[int] = field(default_factory=list)
    allocated_buffer_zeroed: list[bool] = field(default_factory=list)
    destroyed_ids: list[int] = field(default_factory=list)
    launch_grids: list[tuple[int, int, int]] = field(default_factory=list)
    launch_blocks: list[tuple[int, int, int]] = field(default_factory=list)
    launch_scalars: list[tuple[int | float, ...]] = field(default_factory=list)
    launch_buffer_ids: list[tuple[int, ...]] = field(default_factory=list)
    launch_streams: list[int | None] = field(default_factory=list)
    sms: int = 0
    """SMs to split (``split_sms``); 0: none, like the host backend."""
    sm_step: int = 8
    split: SmSplit = field(default_factory=SmSplit)
    stream_places: list[tuple[str | None, int]] = field(default_factory=list)
    """Each stream's partition and priority, in the order made."""
    _next_id: int = 1
    _live: dict[int, DeviceBuffer | LoadedKernel] = field(default_factory=dict)
    _closed: bool = False

    @property
    def kind(self) -> BackendKind:
        return BackendKind.RECORDING

    @property
    def prepared_takes_scalars(self) -> bool:
        return True

    @property
    def formats(self) -> frozenset[ArtifactFormat]:
        return frozenset(ArtifactFormat)

    @property
    def device_name(self) -> str:
        return "recording"

    @property
    def last_destroyed_id(self) -> int | None:
        return self.destroyed_ids[-1] if self.destroyed_ids else None

    @property
    def launch_scalar_u32s(self) -> list[int | float | None]:
        """The first scalar of each launch, as the executor's tests read it."""
        return [scalars[0] if scalars else None for scalars in self.launch_scalars]

    @property
    def last_buffer_ids(self) -> tuple[int, ...]:
        return self.launch_buffer_ids[-1] if self.launch_buffer_ids else ()

    @property
    def last_launch_buffer_count(self) -> int:
        return len(self.last_buffer_ids)

    @property
    def live_ids(self) -> set[int]:
        return set(self._live)

    def _take_id(self) -> int:
        object_id = self._next_id
        self._next_id += 1
        return object_id

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
        if exportable:
            raise UnsupportedOperation("the recording backend has no memory to export")
        if (
            self.fail_buffer_allocate_after_count is not None
            and self.buffer_allocate_count >= self.fail_buffer_allocate_after_count
        ):
            count = self.buffer_allocate_count + 1
            raise OutOfMemory(f"recording backend: allocation {count} fails")
        buffer = DeviceBuffer(
            self._take_id(), BackendKind.RECORDING, byte_size, 0, dtype, element_count
        )
        self.buffer_allocate_count += 1
        self.allocated_buffer_ids.append(buffer.id)
        self.allocated_buffer_byte_sizes.append(byte_size)
        self.allocated_buffer_alignments.append(alignment)
        self.allocated_buffer_zeroed.append(zero)
        self._live[buffer.id] = buffer
        return buffer

    def export_buffer(self, buffer: DeviceBuffer) -> Exported:
        raise FailedPrecondition(f"buffer {buffer.id} was not allocated exportable")

    def create_artifact(self, request: ArtifactRequest) -> CompiledArtifact:
        self.create_count += 1
        return CompiledArtifact(request, request.payload)

    def load_artifact(self, artifact: CompiledArtifact) -> LoadedKernel:
        if self.fail_load_after_count is not None and self.load_count >= self.fail_load_after_count:
            raise RuntimeUnavailable(f"recording backend: load {self.load_count + 1} fails")
        kernel = LoadedKernel(self._take_id(), artifact.kernel_name)
        self.load_count += 1
        self._live[kernel.id] = kernel
        return kernel

    def prepare(self, requests: Sequence[LaunchRequest]) -> PreparedLaunch:
        return SequentialLaunch(self, requests)

    def launch(self, request: LaunchRequest) -> None:
        if (
            self.fail_launch_after_count is not None
            and self.launch_count >= self.fail_launch_after_count
        ):
            raise LaunchFailed(f"recording backend: launch {self.launch_count + 1} fails")
        if request.loaded.id not in self._live:
            raise LaunchFailed(f"kernel {request.loaded.id} is not loaded")
        self.launch_count += 1
        self.launch_grids.append(request.geometry.grid)
        self.launch_blocks.append(request.geometry.block)
        self.launch_scalars.append(tuple(s.value for s in request.scalars))
        self.launch_buffer_ids.append(tuple(b.id for b in request.buffers))
        self.launch_streams.append(None if request.stream is None else request.stream.id)

    def destroy(self, obj: DeviceBuffer | LoadedKernel) -> None:
        self.destroy_count += 1
        self.destroyed_ids.append(obj.id)
        self._live.pop(obj.id, None)

    def synchronize(self, stream: Stream | None = None) -> None:
        self.synchronize_count += 1

    def create_stream(self, partition: str | None = None, priority: int = 0) -> Stream:
        if partition is not None and self.split.sms_of(partition) is None:
            raise UnsupportedOperation(f"no SM partition {partition!r} was made")
        self.stream_places.append((partition, priority))
        return Stream(self._take_id(), partition=partition)

    def split_sms(self, specs: Sequence[PartitionSpec]) -> SmSplit:
        """Deals ``sms`` SMs in ``sm_step`` steps as a GPU would (none: unconfined)."""
        if not self.sms:
            self.split = SmSplit(unconfined="the recording backend has no SMs")
            return self.split
        try:
            counts = deal_groups(specs, self.sms, self.sm_step)
        except ValueError as error:
            self.split = SmSplit(self.sms, unconfined=str(error))
            return self.split
        made = (Partition(s.name, n * self.sm_step) for s, n in zip(specs, counts, strict=True))
        self.split = SmSplit(self.sms, tuple(made))
        return self.split

    def destroy_stream(self, stream: Stream) -> None:
        pass

    def record_event(self, stream: Stream | None) -> Event:
        return Event(self._take_id())

    def wait_event(self, stream: Stream | None, event: Event) -> None:
        pass

    def event_done(self, event: Event) -> bool:
        return True

    def wait_event_for(self, event: Event, seconds: float) -> bool:
        return True

    def notify(self, stream: Stream | None, callback: Callable[[], None]) -> None:
        callback()

    def notify_event(
        self, event: Event, stream: Stream | None, callback: Callable[[], None]
    ) -> None:
        callback()

    def drop_queued(self, stream: Stream) -> None:
        pass

    def synchronize_event(self, event: Event) -> None:
        pass

    def destroy_event(self, event: Event) -> None:
        pass

    def write(
        self, buffer: DeviceBuffer, offset: int, data: bytes | memoryview, stream: Stream | None
    ) -> None:
        pass

    def read(self, buffer: DeviceBuffer, offset: int, size: int, stream: Stream | None) -> bytes:
        return bytes(size)

    def read_into(
        self, buffer: DeviceBuffer, offset: int, out: bytearray | memoryview, stream: Stream | None
    ) -> None:
        view = memoryview(out).cast("B")
        view[:] = bytes(view.nbytes)

    def pin_host(self, memory: memoryview, fd: int | None = None) -> object:
        return None  # host memory is copied by the stream worker: nothing to lock

    def unpin_host(self, pinned: object) -> None:
        return None

    def memory_in_use(self) -> int:
        return sum(b.byte_size for b in self._live.values() if isinstance(b, DeviceBuffer))

    def close(self) -> None:
        self._closed = True
