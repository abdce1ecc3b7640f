"""The blocking accy client: Client, Session, Buffer and Launch over one gRPC channel."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

import grpc
import numpy as np

from accy import _chunks, _dtypes
from accy._attach import AttachStream
from accy._chunks import DEFAULT_CHUNK_SIZE, Progress
from accy._dtypes import DTypeLike
from accy._models import Attachment, PipelineInfo, Status
from accy._paths import default_target
from accy._rpc import Stub, channel_options
from accy.errors import (
    AccyError,
    DaemonUnreachable,
    FieldViolation,
    InvalidArgument,
    NotFound,
    Unavailable,
    from_rpc_error,
)
from accy.launch.v1 import launch_pb2 as pb

__all__ = [
    "CLIENT_ID_METADATA",
    "DEFAULT_TIMEOUT",
    "Buffer",
    "Client",
    "Launch",
    "Session",
    "open_channel",
    "resolve_target",
]

CLIENT_ID_METADATA = "accy-client-id"
"""The metadata key that names the attached client on every call."""

DEFAULT_TIMEOUT = 120.0
"""Seconds each call may take unless the caller says otherwise."""

_T = TypeVar("_T")
_UNSET: Any = object()


def resolve_target(target: str | None = None) -> str:
    """The address to dial: ``target``, else ``ACCY_TARGET``, else the daemon's default socket.

    A bare filesystem path is taken as a Unix socket.
    """
    if not target:
        target = default_target()
    if target.startswith(("/", "./")):
        target = f"unix:{target}"
    return target


def open_channel(target: str, credentials: grpc.ChannelCredentials | None = None) -> grpc.Channel:
    """A channel to ``target`` (already resolved): TLS when ``credentials`` are given."""
    if credentials is not None:
        return grpc.secure_channel(target, credentials, channel_options())
    return grpc.insecure_channel(target, channel_options())


def _close_quietly(closer: Callable[[], None]) -> None:
    """Run a best-effort cleanup: a daemon that went away already freed what it held."""
    with contextlib.suppress(NotFound, Unavailable):
        closer()


class _Closeable:
    """Idempotent ``close()`` plus context-manager support for client-owned objects."""

    _closed = False

    def _close(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Free what this object holds on the daemon; later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        self._close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Client(_Closeable):
    """One attached connection to an ``accyd`` daemon.

    Opening attaches (a background thread keeps the Attach stream open);
    ``close()`` detaches, and the daemon frees every session and buffer this
    client made. Use it as a context manager::

        with Client() as client:
            (y,) = client.run("accy.kernel.device_scan", x)
    """

    def __init__(
        self,
        target: str | None = None,
        *,
        client_name: str | None = None,
        token: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        credentials: grpc.ChannelCredentials | None = None,
        attach_timeout: float = 10.0,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
    ) -> None:
        self.target = resolve_target(target)
        self.timeout = timeout
        self.chunk_size = _chunks.check_chunk_size(chunk_size)
        self._channel = open_channel(self.target, credentials)
        self._stub = Stub(self._channel)
        auth = (("authorization", f"Bearer {token}"),) if token else ()
        name = client_name or f"accy-python/{os.getpid()}"
        self._attach = AttachStream(self._stub, name, auth, self._translate)
        try:
            self.attachment: Attachment = self._attach.wait_attached(attach_timeout)
        except BaseException:
            self._channel.close()
            raise
        self._metadata = (*auth, (CLIENT_ID_METADATA, self.attachment.client_id))
        self._pipelines: dict[str, list[PipelineInfo]] = {}
        self._lock = threading.Lock()

    # -- plumbing -------------------------------------------------------------

    def _translate(self, error: grpc.RpcError) -> AccyError:
        accy_error = from_rpc_error(error)
        if isinstance(accy_error, Unavailable) and accy_error.reason is None:
            return DaemonUnreachable(self.target, accy_error.message)
        return accy_error

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"the client of {self.target} is closed")

    def _unary(
        self,
        method: grpc.UnaryUnaryMultiCallable[Any, _T],
        request: Any,
        timeout: float | None = _UNSET,
    ) -> _T:
        """Call one unary RPC with this client's metadata; errors come back typed."""
        self._check_open()
        try:
            return method(request, metadata=self._metadata, timeout=self._timeout(timeout))
        except grpc.RpcError as error:
            raise self._translate(error) from None

    def _stream_in(
        self,
        method: grpc.StreamUnaryMultiCallable[Any, _T],
        requests: Iterator[Any],
        timeout: float | None,
    ) -> _T:
        self._check_open()
        try:
            return method(requests, metadata=self._metadata, timeout=timeout)
        except grpc.RpcError as error:
            raise self._translate(error) from None

    def _stream_out(
        self,
        method: grpc.UnaryStreamMultiCallable[Any, _T],
        request: Any,
        timeout: float | None,
    ) -> Iterator[_T]:
        self._check_open()
        call = method(request, metadata=self._metadata, timeout=timeout)
        try:
            yield from call
        except grpc.RpcError as error:
            raise self._translate(error) from None
        finally:
            call.cancel()

    def _timeout(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is _UNSET else timeout

    # -- public API -----------------------------------------------------------

    @property
    def client_id(self) -> str:
        """This client's id on the daemon (sent as ``accy-client-id`` metadata)."""
        return self.attachment.client_id

    @property
    def attached(self) -> bool:
        """Whether the Attach stream is still open (``False`` after the daemon went away)."""
        return not self._closed and self._attach.alive

    def pipelines(self) -> list[PipelineInfo]:
        """Every pipeline in the daemon's catalog."""
        response = self._unary(self._stub.ListPipelines, pb.ListPipelinesRequest())
        infos = [PipelineInfo.from_proto(p) for p in response.pipelines]
        by_target: dict[str, list[PipelineInfo]] = {}
        for info in infos:
            by_target.setdefault(info.target, []).append(info)
        with self._lock:
            self._pipelines = by_target
        return infos

    def pipeline(self, target: str, version: int = 0) -> PipelineInfo:
        """One pipeline's description (``version`` 0: the newest); ``NotFound`` if unknown."""
        with self._lock:
            known = self._pipelines.get(target)
        if known is None:
            self.pipelines()
            with self._lock:
                known = self._pipelines.get(target, [])
        matches = [p for p in known if version in (0, p.version)]
        if not matches:
            what = f"{target} version {version}" if version else target
            raise NotFound(
                f"the daemon has no pipeline {what}",
                field_violations=[FieldViolation("target", f"unknown pipeline {what}")],
            )
        return max(matches, key=lambda p: p.version)

    def status(self) -> Status:
        """The daemon's state as this client may see it."""
        return Status.from_proto(self._unary(self._stub.GetStatus, pb.GetStatusRequest()))

    def load(self, target: str, version: int = 0, format: str = "", *, device: int = 0) -> Session:
        """Create (or return, if this client has it) the session for this pipeline."""
        response = self._unary(
            self._stub.LoadPipeline,
            pb.LoadPipelineRequest(target=target, version=version, format=format, device=device),
        )
        return Session(self, response)

    def buffer(
        self,
        array_or_nbytes: np.ndarray[Any, Any] | Sequence[Any] | int,
        dtype: DTypeLike | None = None,
        *,
        device: int = 0,
        progress: Progress | None = None,
    ) -> Buffer:
        """A device buffer: of ``nbytes`` bytes, or holding a copy of an array.

        Given an array (or a sequence), the buffer takes its size and element
        type (``dtype`` converts it first) and the data is uploaded.
        """
        if isinstance(array_or_nbytes, int | np.integer):
            nbytes = int(array_or_nbytes)
            kind = _dtypes.to_numpy(dtype) if dtype is not None else None
            return self._allocate(nbytes, kind, device)
        array = np.asarray(array_or_nbytes, dtype=dtype)
        kind = _dtypes.to_numpy(array.dtype)
        buffer = self._allocate(array.size * kind.itemsize, kind, device)
        try:
            buffer.write(array, progress=progress)
        except BaseException:
            _close_quietly(buffer.free)
            raise
        return buffer

    def empty(self, count: int, dtype: DTypeLike, *, device: int = 0) -> Buffer:
        """A device buffer of ``count`` elements of ``dtype`` (contents undefined)."""
        kind = _dtypes.to_numpy(dtype)
        return self._allocate(count * kind.itemsize, kind, device)

    def _allocate(self, nbytes: int, dtype: np.dtype[Any] | None, device: int) -> Buffer:
        if nbytes < 0:
            raise InvalidArgument(
                f"a buffer cannot hold {nbytes} bytes",
                field_violations=[FieldViolation("byte_size", "must not be negative")],
            )
        response = self._unary(
            self._stub.AllocateBuffer,
            pb.AllocateBufferRequest(byte_size=nbytes, dtype=_dtypes.to_wire(dtype), device=device),
        )
        return Buffer(self, response.buffer_id, nbytes, response.byte_size, dtype, device)

    def run(
        self,
        target: str,
        *operands: np.ndarray[Any, Any],
        version: int = 0,
        format: str = "",
        timeout: float | None = _UNSET,
        **scalars: float,
    ) -> list[np.ndarray[Any, Any]]:
        """Run a pipeline in one call: operands inline, results returned (for small data).

        A runtime scalar that an operand's extent names alone (``n`` for
        ``x: f32[n]``) defaults to that operand's length.
        """
        info = self.pipeline(target, version)
        arrays = [np.asarray(a) for a in operands]
        if len(arrays) != len(info.operands):
            raise InvalidArgument(
                f"{target} takes {len(info.operands)} operands, got {len(arrays)}",
                field_violations=[FieldViolation("operands", "wrong count")],
            )
        tensors = []
        values: dict[str, float] = dict(scalars)
        for index, (spec, array) in enumerate(zip(info.operands, arrays, strict=True)):
            kind = spec.dtype or _dtypes.to_numpy(array.dtype)
            if array.dtype.newbyteorder("<") != kind:
                why = f"is {array.dtype}, the pipeline takes {_dtypes.name_of(kind)}"
                raise InvalidArgument(
                    f"operand {spec.name!r} {why}",
                    field_violations=[FieldViolation(f"operands[{index}]", why)],
                )
            name = spec.extent.strip()
            if name.isidentifier() and name not in values:
                values[name] = array.size
            tensors.append(
                pb.Tensor(
                    name=spec.name,
                    dtype=_dtypes.to_wire(kind),
                    data=_chunks.as_bytes(array, kind).tobytes(),
                )
            )
        request = pb.RunRequest(
            target=target,
            version=version,
            format=format,
            operands=tensors,
            runtime_scalars=_dtypes.pack_scalars(info.runtime_scalars, values),
        )
        response = self._unary(self._stub.Run, request, timeout)
        results = []
        for tensor in response.results:
            kind = _dtypes.from_wire(tensor.dtype) or np.dtype(np.uint8)
            results.append(np.frombuffer(tensor.data, dtype=kind).copy())
        return results

    def _close(self) -> None:
        self._attach.close()
        self._channel.close()


class Buffer(_Closeable):
    """A device buffer owned by this client: write and read in streamed chunks, then free."""

    def __init__(
        self,
        client: Client,
        buffer_id: str,
        nbytes: int,
        capacity: int,
        dtype: np.dtype[Any] | None,
        device: int,
    ) -> None:
        self._client = client
        self.id = buffer_id
        self.nbytes = nbytes
        self.capacity = capacity
        self.dtype = dtype
        self.device = device

    def __repr__(self) -> str:
        dtype = _dtypes.name_of(self.dtype)
        state = " freed" if self._closed else ""
        return f"<accy.Buffer {self.id} {self.nbytes} bytes {dtype}{state}>"

    @property
    def size(self) -> int:
        """Elements of ``dtype`` the buffer holds (bytes when it has no dtype)."""
        return self.nbytes // (self.dtype.itemsize if self.dtype is not None else 1)

    def _range(self, offset: int, size: int) -> None:
        if offset < 0 or size < 0 or offset + size > self.nbytes:
            why = f"bytes {offset}..{offset + size} are outside 0..{self.nbytes}"
            raise InvalidArgument(
                f"buffer {self.id}: {why}", field_violations=[FieldViolation("offset", why)]
            )

    def write(
        self,
        array: np.ndarray[Any, Any] | Sequence[Any],
        offset: int = 0,
        *,
        chunk_size: int | None = None,
        progress: Progress | None = None,
        timeout: float | None = _UNSET,
    ) -> int:
        """Upload ``array`` at byte ``offset`` in chunks; returns the bytes written.

        An ndarray must have the buffer's dtype (no silent conversion); a plain
        sequence is converted to it.
        """
        data = array if isinstance(array, np.ndarray) else np.asarray(array, dtype=self.dtype)
        kind = _dtypes.to_numpy(data.dtype)
        if self.dtype is not None and kind != self.dtype:
            why = f"is {data.dtype}, the buffer holds {_dtypes.name_of(self.dtype)}"
            raise InvalidArgument(
                f"buffer {self.id}: data {why}", field_violations=[FieldViolation("data", why)]
            )
        raw = _chunks.as_bytes(data, kind)
        self._range(offset, len(raw))
        size = _chunks.check_chunk_size(chunk_size or self._client.chunk_size)
        chunks = _chunks.write_chunks(self.id, raw, offset, size, progress)
        response = self._client._stream_in(
            self._client._stub.WriteBuffer, chunks, self._client._timeout(timeout)
        )
        return response.bytes_written

    def read(
        self,
        dtype: DTypeLike | None = None,
        count: int | None = None,
        *,
        offset: int = 0,
        chunk_size: int | None = None,
        progress: Progress | None = None,
        timeout: float | None = _UNSET,
    ) -> np.ndarray[Any, Any]:
        """Download ``count`` elements (default: to the end) from byte ``offset``, in chunks."""
        kind = _dtypes.to_numpy(dtype) if dtype is not None else self.dtype
        kind = kind if kind is not None else np.dtype(np.uint8)
        if count is None:
            count = max(self.nbytes - offset, 0) // kind.itemsize
        size = count * kind.itemsize
        self._range(offset, size)
        if size == 0:
            return np.empty(0, dtype=kind)
        request = pb.ReadBufferRequest(
            buffer_id=self.id,
            offset=offset,
            size=size,
            chunk_size=_chunks.check_chunk_size(chunk_size or self._client.chunk_size),
        )
        chunks = self._client._stream_out(
            self._client._stub.ReadBuffer, request, self._client._timeout(timeout)
        )
        return _chunks.gather(chunks, offset, size, progress).view(kind)

    def free(self) -> None:
        """Free the buffer on the daemon; later calls do nothing."""
        self.close()

    def _close(self) -> None:
        if not self._client.closed:
            self._client._unary(
                self._client._stub.FreeBuffer, pb.FreeBufferRequest(buffer_id=self.id)
            )


def _buffer_ids(buffers: Sequence[Buffer | str]) -> list[str]:
    return [b if isinstance(b, str) else b.id for b in buffers]


class Session(_Closeable):
    """A loaded pipeline with its own stream on the daemon: launch it many times, then release."""

    def __init__(self, client: Client, response: pb.LoadPipelineResponse) -> None:
        self._client = client
        self.id = response.session_id
        self.created = response.created
        self.format = response.format
        self.info = PipelineInfo.from_proto(response.pipeline)

    def __repr__(self) -> str:
        state = " released" if self._closed else ""
        info = self.info
        return f"<accy.Session {self.id} {info.target} v{info.version} {self.format}{state}>"

    def _scalars(self, values: Mapping[str, object]) -> dict[str, pb.Scalar]:
        return _dtypes.pack_scalars(self.info.runtime_scalars, values)

    def allocate_intermediates(self, **scalars: float) -> int:
        """Allocate the session's scratch once for these scalars; returns its size in bytes."""
        response = self._client._unary(
            self._client._stub.AllocateIntermediates,
            pb.AllocateIntermediatesRequest(
                session_id=self.id, runtime_scalars=self._scalars(scalars)
            ),
        )
        return response.byte_size

    def launch(
        self,
        operands: Sequence[Buffer | str] = (),
        results: Sequence[Buffer | str] = (),
        wait: bool = True,
        *,
        timeout: float | None = _UNSET,
        **scalars: float,
    ) -> Launch:
        """Enqueue the pipeline on this session's stream; with ``wait``, return once it finished."""
        response = self._client._unary(
            self._client._stub.Launch,
            pb.LaunchRequest(
                session_id=self.id,
                operands=_buffer_ids(operands),
                results=_buffer_ids(results),
                runtime_scalars=self._scalars(scalars),
                wait=wait,
            ),
            timeout,
        )
        return Launch(self, response)

    def wait(self, timeout: float | None = _UNSET) -> None:
        """Wait for every launch of this session so far."""
        self._client._unary(
            self._client._stub.WaitLaunch, pb.WaitLaunchRequest(session_id=self.id), timeout
        )

    def release(self) -> None:
        """Wait for the session's work, then free its pool, scratch and stream; idempotent."""
        self.close()

    def _close(self) -> None:
        if not self._client.closed:
            self._client._unary(self._client._stub.Release, pb.ReleaseRequest(session_id=self.id))


class Launch:
    """One launch of a session: done already if it was waited for, else ``wait()`` for it."""

    def __init__(self, session: Session, response: pb.LaunchResponse) -> None:
        self.session = session
        self.id = response.launch_id
        self.completed = response.completed
        self.enqueue_seconds = response.enqueue_seconds
        self.elapsed_seconds = response.elapsed_seconds

    def __repr__(self) -> str:
        state = "completed" if self.completed else "enqueued"
        return f"<accy.Launch {self.id} of {self.session.id} {state}>"

    def wait(self, timeout: float | None = _UNSET) -> Launch:
        """Block until this launch finished on the device; returns ``self``."""
        if not self.completed:
            client = self.session._client
            client._unary(
                client._stub.WaitLaunch,
                pb.WaitLaunchRequest(session_id=self.session.id, launch_id=self.id),
                timeout,
            )
            self.completed = True
        return self
