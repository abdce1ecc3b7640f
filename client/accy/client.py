"""The blocking accy client: ``Client``, the facade over a connection, its attach thread
and the resources it makes (``Session``, ``Buffer``, ``Launch``).

The client stays attached by itself: when its Attach stream breaks (the daemon
restarted, after a device fault or otherwise) it attaches again with back-off,
loads its sessions again, and reports the buffers of the old daemon as lost.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Self

import grpc
import numpy as np

from accy import _chunks, _dtypes, _link_transport
from accy._chunks import DEFAULT_CHUNK_SIZE, Progress
from accy._connection import DEFAULT_WINDOW, UNSET, Connection
from accy._control import Control
from accy._credentials import PemSource, auth_metadata, client_credentials, resolve_token
from accy._dtypes import DTypeLike
from accy._link import Link
from accy._models import Attachment, PipelineInfo, Reattachment, Status
from accy._reattach import Attacher
from accy._requests import pick_pipeline
from accy._resources import Buffer, allocate, operand_arrays
from accy._rpc import open_channel
from accy._seam import Transport
from accy._sessions import Launch, Session, new_session
from accy._target import resolve_target
from accy.errors import (
    BufferLost,
    DeadlineExceeded,
    NotFound,
    Unavailable,
)
from accy.protocol import CLIENT_ID_METADATA

__all__ = [
    "CLIENT_ID_METADATA",
    "DEFAULT_LIVENESS",
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
DEFAULT_REATTACH_TIMEOUT = 30.0
"""Seconds a client keeps trying to attach again after losing its daemon."""
DEFAULT_LIVENESS = 15.0
"""Seconds of silence after which the daemon may detach this client (it pings at a quarter)."""


def _check_window(window: int) -> int:
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"launch_window must be a whole number of launches, 1 or more: {window!r}")
    return window


def check_liveness(liveness: float | None) -> int:
    """The whole seconds of silence the daemon may allow (0: no limit); under 1 is refused."""
    if liveness is not None and liveness < 1:
        raise ValueError(f"liveness must be at least 1 second (or None), not {liveness}")
    return 0 if liveness is None else math.ceil(liveness)


class Client:
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

    Launches made with ``wait=False`` return once sent (through a ring: once
    published; with ``ACCY_RING=0``: once the daemon enqueued them); a ring over
    a stream holds at least ``launch_window`` of them not done at once. One the
    daemon refused raises at a later launch or ``wait`` (or its own ``wait()``).

    Survival: when the daemon goes away (it restarts after a device fault),
    the client attaches again for up to ``reattach_timeout`` seconds (``None``:
    for ever, ``0``: never), loads every open session again (with the same
    scratch scalars) and marks every buffer of the old daemon lost: using one
    raises ``BufferLost``. Calls made meanwhile, and calls that found the
    daemon gone, wait for it within their own timeout. ``on_reattach`` is
    called (on the attach thread) with a ``Reattachment`` each time;
    ``reattachments`` counts them.

    ``transport``: how launches and buffer bytes travel, for tests
    (``accy.testing.FakeTransport``); by default each attachment chooses its own (a ring,
    shared memory, or calls, by the target, ``ACCY_RING`` and ``ACCY_SHM``).
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
        launch_window: int = DEFAULT_WINDOW,
        shared_memory: bool = True,
        transport: Transport | None = None,
    ) -> None:
        self._closed = True  # until attached: close() then has nothing to do
        resolved = resolve_target(target)
        chunk = _chunks.check_chunk_size(chunk_size)
        secure = client_credentials(
            credentials, tls=tls, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key
        )
        check_liveness(liveness)
        window = _check_window(launch_window)
        token = resolve_token(token)
        self._conn = Connection(
            resolved,
            secure,
            server_name=tls_server_name,
            auth=auth_metadata(token),
            has_token=token is not None,
            timeout=timeout,
            chunk_size=chunk,
        )
        self._conn.launch_window = window
        self._conn.shared_memory = shared_memory
        self._conn.transport = transport
        self._control = Control(self._conn)
        self._pipelines: tuple[str, dict[str, list[PipelineInfo]]] = ("", {})
        self._attacher = Attacher(
            self._conn,
            name=client_name or f"accy-python/{os.getpid()}",
            liveness=check_liveness(liveness),
            attach_timeout=attach_timeout,
            reattach_timeout=reattach_timeout,
            on_reattach=on_reattach,
        )
        try:
            self._attacher.start()
        except BaseException:
            self._conn.close()
            raise
        self._closed = False

    # -- settings ---------------------------------------------------------------------

    @property
    def target(self) -> str:
        """The address this client dials (``unix:PATH`` or ``HOST:PORT``)."""
        return self._conn.target

    @property
    def timeout(self) -> float | None:
        """Seconds each call may take unless the caller says otherwise."""
        return self._conn.timeout

    @timeout.setter
    def timeout(self, value: float | None) -> None:
        self._conn.timeout = value

    @property
    def chunk_size(self) -> int:
        """Bytes per streamed chunk of buffer reads and writes."""
        return self._conn.chunk_size

    @chunk_size.setter
    def chunk_size(self, value: int) -> None:
        self._conn.chunk_size = _chunks.check_chunk_size(value)

    @property
    def launch_window(self) -> int:
        """Launches made with ``wait=False`` that a ring over a stream holds not done at once
        (rounded up to a power of two, 16 to 4096); the next one blocks until one is done.
        A ring opened already keeps its size; a shared ring's is the daemon's."""
        return self._conn.launch_window

    @launch_window.setter
    def launch_window(self, value: int) -> None:
        self._conn.launch_window = _check_window(value)

    @property
    def reattach_timeout(self) -> float | None:
        return self._attacher.reattach_timeout

    # -- closing ----------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Detach: the daemon frees every session and buffer this client made; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._conn.close()
        self._attacher.join(5.0)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _latest(self) -> Link:
        link = self._conn.last
        assert link is not None  # attached in __init__
        return link

    # -- public API -----------------------------------------------------------

    @property
    def attachment(self) -> Attachment:
        """Who this client is to the daemon now (it changes when the client reattaches)."""
        return self._latest().attachment

    @property
    def client_id(self) -> str:
        """This client's id on the daemon (sent as ``accy-client-id`` metadata)."""
        return self.attachment.client_id

    @property
    def attached(self) -> bool:
        """Whether the client is attached now (not while it reattaches, nor after it gave up)."""
        return not self._closed and self._conn.link is not None

    @property
    def reattachments(self) -> int:
        """How many times the client attached again by itself."""
        return len(self._attacher.history)

    @property
    def last_reattachment(self) -> Reattachment | None:
        """What the latest reattachment did, if there was one."""
        with self._conn.cond:
            history = self._attacher.history
            return history[-1] if history else None

    def wait_attached(self, timeout: float | None = None) -> Attachment:
        """Block until the client is attached (it may be reattaching); returns who it is.

        Raises the reason if the client gave up (having tried once more),
        ``DeadlineExceeded`` after ``timeout``.
        """
        conn = self._conn
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        revived = False
        with conn.cond:
            while conn.link is None:
                conn.check_open()
                if conn.broken is not None:
                    if revived or conn.revive is None or not conn.revive():
                        raise conn.broken.with_traceback(None)
                    revived = True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DeadlineExceeded(f"the client did not attach again within {timeout} s")
                conn.cond.wait(min(remaining, 1.0))
            return conn.link.attachment

    def pipelines(self) -> list[PipelineInfo]:
        """Every pipeline in the daemon's catalog."""
        conn = self._conn
        infos, link = self._control.pipelines()
        by_target: dict[str, list[PipelineInfo]] = {}
        for info in infos:
            by_target.setdefault(info.target, []).append(info)
        with conn.cond:
            self._pipelines = (link.attachment.instance_id, by_target)
        return infos

    def pipeline(self, target: str, version: int = 0) -> PipelineInfo:
        """One pipeline's description (``version`` 0: the newest); ``NotFound`` if unknown."""
        conn = self._conn
        with conn.cond:
            instance, cached = self._pipelines
            fresh = instance == self._latest().attachment.instance_id
            known = cached.get(target) if fresh else None
        if known is None:  # unknown here, or the daemon restarted (maybe with a new catalog)
            self.pipelines()
            with conn.cond:
                known = self._pipelines[1].get(target, [])
        return pick_pipeline(known, target, version)

    def status(self) -> Status:
        """The daemon's state as this client may see it."""
        return self._control.status()

    def load(
        self, target: str, version: int = 0, format: str = "", *, device: int | None = None
    ) -> Session:
        """Create (or return, if this client has it) the session for this pipeline.

        Each ``Session`` returned holds one load of the daemon's session: closing
        one leaves the session to the others until the last is closed.
        ``device`` ``None``: this client's device, which the daemon picks (the
        least loaded) at the client's first session or buffer; ``Session.device``
        says which.
        """
        loaded, link = self._control.load(target, version, format, device)
        return new_session(self._control, loaded, link)

    def buffer(
        self,
        array_or_nbytes: np.ndarray[Any, Any] | Sequence[Any] | int,
        dtype: DTypeLike | None = None,
        *,
        device: int | None = None,
        progress: Progress | None = None,
        exportable: bool = False,
    ) -> Buffer:
        """A device buffer: of ``nbytes`` bytes, or holding a copy of an array.

        Given an array (or a sequence), the buffer takes its size and element
        type (``dtype`` converts it first) and the data is uploaded.
        ``exportable``: ``Buffer.export`` can map it here (see there).
        """
        if isinstance(array_or_nbytes, int | np.integer):
            nbytes = int(array_or_nbytes)
            kind = _dtypes.to_numpy(dtype) if dtype is not None else None
            return allocate(self._control, nbytes, kind, device, exportable=exportable)
        array = np.asarray(array_or_nbytes, dtype=dtype)
        kind = _dtypes.to_numpy(array.dtype)
        buffer = allocate(
            self._control, array.size * kind.itemsize, kind, device, exportable=exportable
        )
        buffer.shape = array.shape
        try:
            buffer.write(array, progress=progress)
        except BaseException:
            with contextlib.suppress(NotFound, Unavailable, BufferLost):  # gone with its daemon
                buffer.free()
            raise
        return buffer

    def shared_array(
        self, shape: int | tuple[int, ...], dtype: DTypeLike, *, device: int = 0
    ) -> np.ndarray[Any, Any]:
        """A numpy array in memory shared with a local daemon: ``Buffer.write`` from it and
        ``Buffer.read(out=...)`` into it copy nothing on this side. ``FailedPrecondition``
        where the daemon shares no memory (remote, or shared memory turned off)."""
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        conn = self._conn
        link = conn.current_link(None)
        return _link_transport.shared_array(
            link, dims, _dtypes.to_numpy(dtype), device, conn.timeout
        )

    def empty(
        self,
        shape: int | tuple[int, ...],
        dtype: DTypeLike,
        *,
        device: int | None = None,
        exportable: bool = False,
    ) -> Buffer:
        """A device buffer of ``shape`` (a count of elements, or dims) of ``dtype``
        (contents undefined); ``exportable`` as for ``buffer``."""
        kind = _dtypes.to_numpy(dtype)
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        buffer = allocate(
            self._control, math.prod(dims) * kind.itemsize, kind, device, exportable=exportable
        )
        buffer.shape = dims if not isinstance(shape, int) else None
        return buffer

    def run(
        self,
        target: str,
        *operands: np.ndarray[Any, Any],
        version: int = 0,
        format: str = "",
        timeout: float | None = UNSET,
        **scalars: float,
    ) -> list[np.ndarray[Any, Any]]:
        """Run a pipeline in one call: operands inline, results returned (for small data).

        A runtime scalar that an operand's extent (or one dim of its shape) names alone
        defaults to the array's length (or that dim); results come back in their shape.
        """
        info = self.pipeline(target, version)
        arrays = operand_arrays(operands, [spec.name for spec in info.operands], target)
        return self._control.run(info, target, version, format, arrays, scalars, timeout)
