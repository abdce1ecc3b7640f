"""The blocking accy client: Client, Session, Buffer and Launch over one gRPC channel.

The client stays attached by itself: when its Attach stream breaks (the daemon
restarted, after a device fault or otherwise) it attaches again with back-off,
loads its sessions again, and reports the buffers of the old daemon as lost.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

import grpc
import numpy as np

from accy import _chunks, _dtypes
from accy._attach import AttachStream
from accy._chunks import DEFAULT_CHUNK_SIZE, Progress
from accy._credentials import PemSource, auth_metadata, channel_credentials, resolve_token
from accy._dtypes import DTypeLike
from accy._launches import LaunchStream
from accy._link import DEVICE_LOST, Link, device_lost, names_client
from accy._models import Attachment, PipelineInfo, Reattachment, Status
from accy._rpc import Stub, channel_options
from accy.errors import (
    AccyError,
    BufferLost,
    DaemonUnreachable,
    FieldViolation,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    SessionLost,
    Unauthenticated,
    Unavailable,
    from_rpc_error,
    with_hint,
)
from accy.protocol import CLIENT_ID_METADATA, default_target
from accy.protocol.launch.v1 import launch_pb2 as pb

__all__ = [
    "CLIENT_ID_METADATA",
    "DEFAULT_REATTACH_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "Buffer",
    "Client",
    "Launch",
    "Session",
    "open_channel",
    "resolve_target",
]

DEFAULT_TIMEOUT = 120.0
"""Seconds each call may take unless the caller says otherwise."""

_PACKED_KEPT = 64
"""Distinct sets of scalar values a session keeps packed for its next launches."""

DEFAULT_REATTACH_TIMEOUT = 30.0
"""Seconds a client keeps trying to attach again after losing its daemon."""
DEFAULT_LIVENESS = 15.0
"""Seconds of silence after which the daemon may detach this client (it pings at a quarter)."""

_FIRST_RETRY = 0.05
_MAX_RETRY = 1.0

_T = TypeVar("_T")
_UNSET: Any = object()

log = logging.getLogger("accy")


def resolve_target(target: str | None = None) -> str:
    """The address to dial: ``target``, else ``ACCY_TARGET``, else the daemon's default socket.

    A bare filesystem path is taken as a Unix socket.
    """
    if not target:
        target = default_target()
    if target.startswith(("/", "./")):
        target = f"unix:{target}"
    return target


def open_channel(
    target: str,
    credentials: grpc.ChannelCredentials | None = None,
    *,
    server_name: str | None = None,
) -> grpc.Channel:
    """A channel to ``target`` (already resolved): TLS when ``credentials`` are given.

    ``server_name`` is the name to check the daemon's certificate against,
    where it differs from the target's host.
    """
    options: list[tuple[str, Any]] = list(channel_options())
    if credentials is None:
        return grpc.insecure_channel(target, options)
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    return grpc.secure_channel(target, credentials, options)


def _close_quietly(closer: Callable[[], None]) -> None:
    """Run a best-effort cleanup: a daemon that went away already freed what it held."""
    with contextlib.suppress(NotFound, Unavailable, BufferLost):
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

    Credentials: ``token`` (else ``$ACCY_TOKEN``) goes as ``authorization:
    Bearer`` metadata on every call; TLS is used when ``tls`` (the system's
    roots), ``tls_ca`` or a client certificate is given, mutual TLS with
    ``tls_cert`` and ``tls_key`` (each a path or PEM bytes).

    Survival: when the daemon goes away (it restarts after a device fault),
    the client attaches again for up to ``reattach_timeout`` seconds (``None``:
    for ever, ``0``: never), loads every open session again (with the same
    scratch scalars) and marks every buffer of the old daemon lost: using one
    raises ``BufferLost``. Calls made meanwhile wait for it. ``on_reattach``
    is called (on the attach thread) with a ``Reattachment`` each time;
    ``reattachments`` counts them.
    """

    def __init__(
        self,
        target: str | None = None,
        *,
        client_name: str | None = None,
        token: str | None = None,
        tls: bool = False,
        tls_ca: PemSource | None = None,
        tls_cert: PemSource | None = None,
        tls_key: PemSource | None = None,
        tls_server_name: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        attach_timeout: float = 10.0,
        reattach_timeout: float | None = DEFAULT_REATTACH_TIMEOUT,
        on_reattach: Callable[[Reattachment], None] | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        liveness: float | None = DEFAULT_LIVENESS,
    ) -> None:
        self.target = resolve_target(target)
        self.timeout = timeout
        self.reattach_timeout = reattach_timeout
        self.chunk_size = _chunks.check_chunk_size(chunk_size)
        if credentials is not None and (tls or tls_ca or tls_cert or tls_key):
            raise ValueError("pass either credentials or the tls options, not both")
        secure = credentials or channel_credentials(
            tls=tls, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key
        )
        self._secure = secure is not None
        self._token = resolve_token(token)
        self._auth = auth_metadata(self._token)
        self._name = client_name or f"accy-python/{os.getpid()}"
        self._attach_timeout = attach_timeout
        self._on_reattach = on_reattach
        if liveness is not None and liveness < 1:
            raise ValueError(f"liveness must be at least 1 second (or None), not {liveness}")
        self._liveness = 0 if liveness is None else math.ceil(liveness)
        self._channel = open_channel(self.target, secure, server_name=tls_server_name)
        self._stub = Stub(self._channel)
        self._cond = threading.Condition()
        self._stopping = threading.Event()
        self._broken: AccyError | None = None
        self._history: list[Reattachment] = []
        self._sessions: weakref.WeakValueDictionary[int, Session] = weakref.WeakValueDictionary()
        self._session_keys = itertools.count()
        self._pipelines: dict[str, list[PipelineInfo]] = {}
        try:
            stream = AttachStream.open(
                self._stub,
                self._name,
                self._auth,
                self._translate,
                attach_timeout,
                liveness_seconds=self._liveness,
            )
        except BaseException:
            self._channel.close()
            raise
        self._last = self._new_link(stream, 0)
        self._link: Link | None = self._last
        self._thread = threading.Thread(target=self._keep_attached, name="accy-attach", daemon=True)
        self._thread.start()
        if self._liveness:
            self._pinger = threading.Thread(target=self._keep_alive, name="accy-ping", daemon=True)
            self._pinger.start()

    def _keep_alive(self) -> None:
        """The ping thread: tell the daemon this client lives, four times per liveness period.

        A hung process stops pinging with everything else, so the daemon frees
        what it holds; a live but idle one keeps its sessions and buffers.
        """
        period = self._liveness / 4
        request = pb.PingRequest()
        while not self._stopping.wait(period):
            link = self._link
            if link is None:  # reattaching: the new Attach is news enough
                continue
            with contextlib.suppress(grpc.RpcError, ValueError):  # ValueError: channel closed
                self._stub.Ping(request, metadata=link.metadata, timeout=period)

    # -- staying attached -------------------------------------------------------

    def _new_link(self, stream: AttachStream, generation: int) -> Link:
        client_id = stream.attachment.client_id
        return Link(generation, stream, (*self._auth, (CLIENT_ID_METADATA, client_id)))

    def _keep_attached(self) -> None:
        """The attach thread: pump the stream; when it breaks, attach again (or give up)."""
        link = self._last
        try:
            while True:
                ended = link.stream.pump()
                if self._stopping.is_set():
                    return
                self._lose(link, ended)
                following = self._reattach(link)
                if following is None:
                    return
                link = following
        except BaseException as error:  # a bug here must not leave callers waiting
            if self._stopping.is_set():  # closed under it: its calls failed, as they should
                return
            log.exception("the accy attach thread failed")
            self._give_up(link, Unavailable(f"the client's attach thread failed: {error!r}"))

    def _lose(self, link: Link, error: AccyError) -> None:
        """``link`` is gone (``error`` says why): calls wait for the next one from now on."""
        with self._cond:
            link.lose(error, time.monotonic())
            if self._link is link:
                self._link = None
        link.stream.cancel()
        link.close_launches()

    def _reattach(self, old: Link) -> Link | None:
        """Attach again with back-off, reload the sessions, publish the new link."""
        limit = self.reattach_timeout
        deadline = math.inf if limit is None else old.lost_at + limit
        delay = _FIRST_RETRY
        failure: AccyError | None = None
        while not self._stopping.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                stream = AttachStream.open(
                    self._stub,
                    self._name,
                    self._auth,
                    self._translate,
                    min(remaining, self._attach_timeout),
                    wait_for_ready=True,
                    liveness_seconds=self._liveness,
                )
            except (Unauthenticated, PermissionDenied) as error:
                self._give_up(old, error)
                return None
            except AccyError as error:
                failure = error
                if device_lost(error):  # the old daemon, faulted: wait for its successor
                    self._lose(old, error)
            except ValueError:  # the channel was closed: the client is closing
                return None
            else:
                link = self._new_link(stream, old.generation + 1)
                try:
                    return self._adopt(old, link)
                except AccyError as error:  # that daemon went away too (or is the faulted one)
                    self._lose(link, error)
                    failure = error
            if self._stopping.wait(delay):
                return None
            delay = min(2 * delay, _MAX_RETRY)
        self._give_up(old, failure)
        return None

    def _adopt(self, old: Link, link: Link) -> Link:
        """Restore the sessions on ``link`` and make it the client's link; returns it."""
        restarted = link.attachment.instance_id != old.attachment.instance_id
        if not restarted and old.reason == DEVICE_LOST:
            raise Unavailable("the faulted daemon has not restarted yet", reason=DEVICE_LOST)
        restored, lost = self._restore_sessions(link)
        with self._cond:
            if restarted:
                old.restarted()
            record = Reattachment(
                number=len(self._history) + 1,
                previous=old.attachment,
                attachment=link.attachment,
                why=old.lost or "",
                restarted=restarted,
                fault_session=old.fault_session,
                sessions_restored=restored,
                sessions_lost=lost,
                buffers_lost=len(old.buffers),
                seconds=time.monotonic() - old.lost_at,
            )
            self._history.append(record)
            self._pipelines = {}
            self._last = self._link = link
            self._cond.notify_all()
        log.info(
            "accy client reattached to %s (%s): %d sessions restored, %d lost, %d buffers lost",
            self.target,
            record.why,
            restored,
            lost,
            record.buffers_lost,
        )
        if self._on_reattach is not None:
            try:
                self._on_reattach(record)
            except Exception:
                log.exception("the on_reattach callback raised")
        return link

    def _restore_sessions(self, link: Link) -> tuple[int, int]:
        """Load every open session again on ``link``; returns (restored, lost)."""
        with self._cond:
            sessions = list(self._sessions.values())
        restored = lost = 0
        for session in sessions:
            if session.closed:
                continue
            if session._move(link):
                restored += 1
            else:
                lost += 1
        return restored, lost

    def _give_up(self, old: Link, error: AccyError | None) -> None:
        """Stop trying: every call from now on raises why."""
        if not isinstance(error, Unauthenticated | PermissionDenied):
            if not self.reattach_timeout and self.reattach_timeout is not None:
                text = f"lost the daemon at {self.target} ({old.lost}); reattaching is off"
            else:
                text = (
                    f"lost the daemon at {self.target} ({old.lost}) and could not attach again "
                    f"within {self.reattach_timeout} s"
                )
            error = Unavailable(text + (f": {error}" if error else ""), reason="REATTACH_FAILED")
        with self._cond:
            self._broken = error
            self._cond.notify_all()

    def _current_link(self) -> Link:
        """The link to call on: the current one, else wait while the client attaches again."""
        link = self._link
        if link is not None:
            return link
        with self._cond:
            while True:
                self._check_open()
                if self._link is not None:
                    return self._link
                if self._broken is not None:
                    raise self._broken.with_traceback(None)
                self._cond.wait(1.0)

    # -- plumbing -------------------------------------------------------------

    def _translate(self, error: grpc.RpcError) -> AccyError:
        return self._hint(from_rpc_error(error))

    def _hint(self, failure: AccyError) -> AccyError:
        """``failure`` with what to do about it, where the client knows."""
        if isinstance(failure, Unavailable) and failure.reason is None:
            return DaemonUnreachable(self.target, failure.message, self._unreachable_hint())
        if isinstance(failure, Unauthenticated):
            if self._token:
                return with_hint(
                    failure, "the daemon refused the token given (--token or ACCY_TOKEN)"
                )
            return with_hint(
                failure, "this daemon wants a bearer token: pass --token or set ACCY_TOKEN"
            )
        if isinstance(failure, PermissionDenied):
            return with_hint(
                failure, "pass a token whose scopes allow this call (--token or ACCY_TOKEN)"
            )
        return failure

    def _unreachable_hint(self) -> str | None:
        if self.target.startswith("unix:") or self._secure:
            return None
        return "if it serves TLS, pass --tls-ca (or --tls for the system's roots)"

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"the client of {self.target} is closed")

    def _failed(self, error: grpc.RpcError, link: Link) -> AccyError:
        """The typed error of a failed call; one that shows the link gone loses it."""
        return self._judged(self._translate(error), link)

    def _judged(self, failure: AccyError, link: Link) -> AccyError:
        """``failure``, after losing ``link`` if it shows the link gone."""
        if device_lost(failure) or names_client(failure):
            self._lose(link, failure)
        return failure

    def _call(
        self,
        method: grpc.UnaryUnaryMultiCallable[Any, _T],
        request: Any,
        timeout: float | None = _UNSET,
        *,
        link: Link | None = None,
    ) -> tuple[_T, Link]:
        """Call one unary RPC on ``link`` (default: the current one); see ``_on_link``."""

        def send(message: Any, use: Link) -> _T:
            return method(message, metadata=use.metadata, timeout=self._timeout(timeout))

        return self._on_link(request, send, link)

    def _launch(
        self, request: Callable[[Link], pb.LaunchRequest], timeout: float | None
    ) -> tuple[pb.LaunchResponse, Link]:
        """One launch on the current link's LaunchStream (as ``_call`` does a unary call)."""

        def send(message: pb.LaunchRequest, use: Link) -> pb.LaunchResponse:
            return self._launches(use).launch(message, self._timeout(timeout))

        return self._on_link(request, send)

    def _on_link(
        self, request: Any, send: Callable[[Any, Link], _T], link: Link | None = None
    ) -> tuple[_T, Link]:
        """Send ``request`` on ``link`` (default: the current one); errors come back typed.

        ``request`` is a message, or a function of the link that builds it
        (ids differ between links). A request the daemon refused because it no
        longer knew this client did nothing: it is sent once more after the
        client attached again.
        """
        self._check_open()
        for again in (True, False):
            use = link or self._current_link()
            message = request(use) if callable(request) else request
            try:
                return send(message, use), use
            except grpc.RpcError as error:
                failure = self._failed(error, use)
            except AccyError as error:  # refused in-band: a LaunchStream answer
                failure = self._judged(error, use)
            if not (again and link is None and names_client(failure)):
                raise failure
        raise AssertionError("unreachable")

    def _launches(self, link: Link) -> LaunchStream:
        with self._cond:
            self._check_open()
            stream = link.launches
            if stream is None or stream.broken:
                stream = link.launches = LaunchStream(
                    self._stub, link.metadata, self._translate, self._hint
                )
            return stream

    def _unary(
        self,
        method: grpc.UnaryUnaryMultiCallable[Any, _T],
        request: Any,
        timeout: float | None = _UNSET,
    ) -> _T:
        """Call one unary RPC on the current link; returns its answer."""
        return self._call(method, request, timeout)[0]

    def _stream_in(
        self,
        method: grpc.StreamUnaryMultiCallable[Any, _T],
        requests: Iterator[Any],
        timeout: float | None,
        link: Link,
    ) -> _T:
        self._check_open()
        try:
            return method(requests, metadata=link.metadata, timeout=timeout)
        except grpc.RpcError as error:
            raise self._failed(error, link) from None

    def _stream_out(
        self,
        method: grpc.UnaryStreamMultiCallable[Any, _T],
        request: Any,
        timeout: float | None,
        link: Link,
    ) -> Iterator[_T]:
        self._check_open()
        call = method(request, metadata=link.metadata, timeout=timeout)
        try:
            yield from call
        except grpc.RpcError as error:
            raise self._failed(error, link) from None
        finally:
            call.cancel()

    def _timeout(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is _UNSET else timeout

    def _register(self, session: Session) -> int:
        with self._cond:
            key = next(self._session_keys)
            self._sessions[key] = session
        return key

    def _forget(self, key: int) -> None:
        with self._cond:
            self._sessions.pop(key, None)

    # -- public API -----------------------------------------------------------

    @property
    def attachment(self) -> Attachment:
        """Who this client is to the daemon now (it changes when the client reattaches)."""
        return self._last.attachment

    @property
    def client_id(self) -> str:
        """This client's id on the daemon (sent as ``accy-client-id`` metadata)."""
        return self.attachment.client_id

    @property
    def attached(self) -> bool:
        """Whether the client is attached now (not while it reattaches, nor after it gave up)."""
        return not self._closed and self._link is not None

    @property
    def reattachments(self) -> int:
        """How many times the client attached again by itself."""
        return len(self._history)

    @property
    def last_reattachment(self) -> Reattachment | None:
        """What the latest reattachment did, if there was one."""
        with self._cond:
            return self._history[-1] if self._history else None

    def wait_attached(self, timeout: float | None = None) -> Attachment:
        """Block until the client is attached (it may be reattaching); returns who it is.

        Raises the reason if the client gave up, ``TimeoutError`` after ``timeout``.
        """
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._link is None:
                self._check_open()
                if self._broken is not None:
                    raise self._broken.with_traceback(None)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"the client did not attach again within {timeout} s")
                self._cond.wait(min(remaining, 1.0))
            return self._link.attachment

    def pipelines(self) -> list[PipelineInfo]:
        """Every pipeline in the daemon's catalog."""
        response = self._unary(self._stub.ListPipelines, pb.ListPipelinesRequest())
        infos = [PipelineInfo.from_proto(p) for p in response.pipelines]
        by_target: dict[str, list[PipelineInfo]] = {}
        for info in infos:
            by_target.setdefault(info.target, []).append(info)
        with self._cond:
            self._pipelines = by_target
        return infos

    def pipeline(self, target: str, version: int = 0) -> PipelineInfo:
        """One pipeline's description (``version`` 0: the newest); ``NotFound`` if unknown."""
        with self._cond:
            known = self._pipelines.get(target)
        if known is None:
            self.pipelines()
            with self._cond:
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
        """Create (or return, if this client has it) the session for this pipeline.

        Each ``Session`` returned holds one load of the daemon's session: closing
        one leaves the session to the others until the last is closed.
        """
        response, link = self._call(
            self._stub.LoadPipeline,
            pb.LoadPipelineRequest(target=target, version=version, format=format, device=device),
        )
        return Session(self, response, link, device)

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
        response, link = self._call(
            self._stub.AllocateBuffer,
            pb.AllocateBufferRequest(byte_size=nbytes, dtype=_dtypes.to_wire(dtype), device=device),
        )
        return Buffer(
            self, response.buffer_id, nbytes, response.byte_size, dtype, device, link=link
        )

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
        self._stopping.set()
        with self._cond:
            link = self._last
            self._cond.notify_all()
        link.stream.cancel()
        link.close_launches(now=True)
        self._channel.close()
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)


class Buffer(_Closeable):
    """A device buffer owned by this client: write and read in streamed chunks, then free.

    A buffer lives on one daemon instance: once the client lost it (the daemon
    restarted), ``lost`` is true and every use raises ``BufferLost``.
    """

    def __init__(
        self,
        client: Client,
        buffer_id: str,
        nbytes: int,
        capacity: int,
        dtype: np.dtype[Any] | None,
        device: int,
        *,
        link: Link | None = None,
    ) -> None:
        self._client = client
        self._link = link or client._current_link()
        self._link.buffers.add(self)
        self.id = buffer_id
        self.nbytes = nbytes
        self.capacity = capacity
        self.dtype = dtype
        self.device = device

    def __repr__(self) -> str:
        dtype = _dtypes.name_of(self.dtype)
        state = " freed" if self._closed else " lost" if self.lost else ""
        return f"<accy.Buffer {self.id} {self.nbytes} bytes {dtype}{state}>"

    @property
    def lost(self) -> bool:
        """Whether the daemon that held this buffer is gone (its data with it)."""
        return self._link.lost is not None

    @property
    def size(self) -> int:
        """Elements of ``dtype`` the buffer holds (bytes when it has no dtype)."""
        return self.nbytes // (self.dtype.itemsize if self.dtype is not None else 1)

    def _on(self, link: Link) -> str:
        """This buffer's id for a call on ``link``; ``BufferLost`` if the buffer is not there."""
        mine = self._link
        if mine.lost is not None:
            raise BufferLost(self.id, mine.lost, session=mine.fault_session)
        if mine is not link and link.lost is None:
            raise BufferLost(self.id, "the client attached again", session=None)
        return self.id

    @contextlib.contextmanager
    def _using(self) -> Iterator[Link]:
        """The link to transfer on; a failure because that link went is ``BufferLost``."""
        link = self._link
        self._on(link)
        try:
            yield link
        except AccyError as error:
            if link.lost is None or device_lost(error):
                raise
            raise BufferLost(self.id, link.lost, session=link.fault_session) from error

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
        client = self._client
        with self._using() as link:
            response = client._stream_in(
                client._stub.WriteBuffer, chunks, client._timeout(timeout), link
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
        self._on(self._link)
        if size == 0:
            return np.empty(0, dtype=kind)
        request = pb.ReadBufferRequest(
            buffer_id=self.id,
            offset=offset,
            size=size,
            chunk_size=_chunks.check_chunk_size(chunk_size or self._client.chunk_size),
        )
        client = self._client
        with self._using() as link:
            chunks = client._stream_out(
                client._stub.ReadBuffer, request, client._timeout(timeout), link
            )
            return _chunks.gather(chunks, offset, size, progress).view(kind)

    def free(self) -> None:
        """Free the buffer on the daemon; later calls, and calls on a lost buffer, do nothing."""
        self.close()

    def _close(self) -> None:
        link = self._link
        link.buffers.discard(self)
        if self._client.closed or link.lost is not None:
            return
        try:
            self._client._call(
                self._client._stub.FreeBuffer, pb.FreeBufferRequest(buffer_id=self.id), link=link
            )
        except AccyError:
            if link.lost is None:
                raise


def _buffer_ids(buffers: Sequence[Buffer | str], link: Link) -> list[str]:
    return [b if isinstance(b, str) else b._on(link) for b in buffers]


class Session(_Closeable):
    """A loaded pipeline with its own stream on the daemon: launch it many times, then release.

    When the client attaches to a restarted daemon, the session is loaded
    again (its scratch too) and keeps working under a new ``id``; if that
    fails, its calls raise ``SessionLost``.
    """

    def __init__(
        self, client: Client, response: pb.LoadPipelineResponse, link: Link, device: int = 0
    ) -> None:
        self._client = client
        self._lock = threading.RLock()
        self.device = device
        self._scratch: dict[str, float] | None = None
        self._failure: AccyError | None = None
        self._unwaited: Link | None = None
        self._packed: dict[tuple[tuple[str, type, object], ...], dict[str, pb.Scalar]] = {}
        self._take(response, link)
        self._key = client._register(self)

    def _take(self, response: pb.LoadPipelineResponse, link: Link) -> None:
        self._id = response.session_id
        self._link = link
        self.created = response.created
        self.format = response.format
        self.info = PipelineInfo.from_proto(response.pipeline)

    @property
    def id(self) -> str:
        """The session's id on the daemon (a new one after the client reattached)."""
        return self._id

    def __repr__(self) -> str:
        state = " released" if self._closed else " lost" if self._failure else ""
        info = self.info
        return f"<accy.Session {self.id} {info.target} v{info.version} {self.format}{state}>"

    def _move(self, link: Link) -> bool:
        """Load the session again on ``link`` (with its scratch); whether that worked.

        ``Unavailable`` (that daemon is going away too) propagates; any other
        refusal leaves the session lost, and its calls raise ``SessionLost``.
        """
        with self._lock:
            if self._link is link or self._failure is not None:
                return self._failure is None
            old_id, why = self._id, self._link.lost or "the client attached again"
            client = self._client
            try:
                response, _ = client._call(
                    client._stub.LoadPipeline,
                    pb.LoadPipelineRequest(
                        target=self.info.target,
                        version=self.info.version,
                        format=self.format,
                        device=self.device,
                    ),
                    link=link,
                )
                if self._scratch is not None:
                    client._call(
                        client._stub.AllocateIntermediates,
                        pb.AllocateIntermediatesRequest(
                            session_id=response.session_id,
                            runtime_scalars=self._scalars(self._scratch),
                        ),
                        link=link,
                    )
            except Unavailable:
                raise
            except AccyError as error:
                if link.lost is not None:
                    raise
                self._failure = SessionLost(old_id, self.info.target, why, error)
                return False
            self._take(response, link)
            return True

    def _on(self, link: Link) -> str:
        """This session's id for a call on ``link``, loading it there first if need be."""
        if self._link is not link:
            self._move(link)
        if self._failure is not None:
            raise self._failure.with_traceback(None)
        return self._id

    def _scalars(self, values: Mapping[str, object]) -> dict[str, pb.Scalar]:
        """The scalars typed for the wire; the same values again reuse the same messages."""
        key = tuple((name, type(value), value) for name, value in values.items())
        try:
            packed = self._packed.get(key)
        except TypeError:  # an unhashable value: packing says what is wrong with it
            return _dtypes.pack_scalars(self.info.runtime_scalars, values)
        if packed is None:
            packed = _dtypes.pack_scalars(self.info.runtime_scalars, values)
            if len(self._packed) >= _PACKED_KEPT:
                self._packed.clear()
            self._packed[key] = packed
        return packed

    def allocate_intermediates(self, **scalars: float) -> int:
        """Allocate the session's scratch once for these scalars; returns its size in bytes.

        The scalars are remembered: a reloaded session gets the same scratch.
        """
        packed = self._scalars(scalars)
        response = self._client._unary(
            self._client._stub.AllocateIntermediates,
            lambda link: pb.AllocateIntermediatesRequest(
                session_id=self._on(link), runtime_scalars=packed
            ),
        )
        with self._lock:
            self._scratch = dict(scalars)
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
        """Enqueue the pipeline on this session's stream; with ``wait``, return once it finished.

        A buffer of a daemon that restarted raises ``BufferLost``; a launch the
        daemon lost its device over raises ``Unavailable`` with reason
        ``DEVICE_LOST`` and ``session`` naming the session that faulted.
        """
        packed = self._scalars(scalars)

        def request(link: Link) -> pb.LaunchRequest:
            return pb.LaunchRequest(
                session_id=self._on(link),
                operands=_buffer_ids(operands, link),
                results=_buffer_ids(results, link),
                runtime_scalars=packed,
                wait=wait,
            )

        response, link = self._client._launch(request, timeout)
        if not wait:
            self._unwaited = link
        return Launch(self, response, link)

    def wait(self, timeout: float | None = _UNSET) -> None:
        """Wait for every launch of this session so far.

        Launches that the daemon lost when it restarted raise ``Unavailable`` (once).
        """
        pending = self._unwaited
        if pending is not None and pending.lost is not None:
            self._unwaited = None
            raise pending.lost_error(f"work enqueued on session {self.id}")
        self._client._unary(
            self._client._stub.WaitLaunch,
            lambda link: pb.WaitLaunchRequest(session_id=self._on(link)),
            timeout,
        )
        if self._unwaited is pending:
            self._unwaited = None

    def release(self) -> None:
        """Let this load go (idempotent); the last one waits for the session's work, then
        frees its pool, scratch and stream."""
        self.close()

    def _close(self) -> None:
        client = self._client
        client._forget(self._key)
        with self._lock:
            link = self._link
        if client.closed or link.lost is not None or self._failure is not None:
            return
        try:
            client._call(client._stub.Release, pb.ReleaseRequest(session_id=self._id), link=link)
        except AccyError:
            if link.lost is None:
                raise


class Launch:
    """One launch of a session: done already if it was waited for, else ``wait()`` for it."""

    def __init__(self, session: Session, response: pb.LaunchResponse, link: Link) -> None:
        self.session = session
        self._link = link
        self._session_id = session.id
        self.id = response.launch_id
        self.completed = response.completed
        self.enqueue_seconds = response.enqueue_seconds
        self.elapsed_seconds = response.elapsed_seconds

    def __repr__(self) -> str:
        state = "completed" if self.completed else "enqueued"
        return f"<accy.Launch {self.id} of {self._session_id} {state}>"

    def wait(self, timeout: float | None = _UNSET) -> Launch:
        """Block until this launch finished on the device; returns ``self``.

        A launch that the daemon lost when it restarted raises ``Unavailable``
        (reason ``DEVICE_LOST`` after a device fault, ``session`` naming the culprit).
        """
        if self.completed:
            return self
        link = self._link
        if link.lost is None:
            client = self.session._client
            try:
                client._call(
                    client._stub.WaitLaunch,
                    pb.WaitLaunchRequest(session_id=self._session_id, launch_id=self.id),
                    timeout,
                    link=link,
                )
            except AccyError as error:
                if link.lost is None or device_lost(error):
                    raise
            else:
                self.completed = True
                return self
        raise link.lost_error(f"launch {self.id} of session {self._session_id}")
