"""Prepared launches on CUDA: a pipeline's stages captured once as a graph and replayed.

One ``cuGraphLaunch`` replaces a launch per stage. The graph bakes in the
buffers' device addresses and the scalars, so its owner (the core's prepared
launch cache) must drop it before any of those buffers is freed. New scalar values are
captured again and applied in place (``cuGraphExecUpdate``: the same kernels and
geometry, other arguments), so the instance, the handle an engine launches, stays. Its
kernel nodes also keep the context of the stream they were captured on: a graph captured on a
primary-context stream runs on every SM even when launched on a green context's
stream, so the capture stream is made in the requests' SM partition.

``DeviceGraph`` holds the instances of a graph made for launch from the device (the device
launcher's, ``device_launcher.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

from accyd.backends.base import LaunchRequest, ScalarChange, Stream, with_scalars
from accyd.backends.cuda.driver import ErrorCheck
from accyd.errors import LaunchFailed

__all__ = ["DeviceGraph", "GraphLaunch"]


class _Capturing(Protocol):
    """What a graph needs of its backend (``CudaBackend``): the driver, its checks, streams."""

    _cu: Any
    _check: ErrorCheck
    _closed: bool

    def create_stream(self, partition: str | None = None, priority: int = 0) -> Stream: ...

    def destroy_stream(self, stream: Stream) -> None: ...

    def launch(self, request: LaunchRequest) -> None: ...

    def _stream_handle(self, stream: Stream | None) -> Any: ...


def _partition_of(requests: Sequence[LaunchRequest]) -> str | None:
    """The SM partition of the requests' stream (a prepared launch is one session's, on its
    one stream); ``None``: the whole device."""
    stream = requests[0].stream if requests else None
    return None if stream is None else stream.partition


def _capture(backend: _Capturing, requests: Sequence[LaunchRequest]) -> Any:
    """A graph of ``requests``, captured on a stream made for it in their partition (so its
    kernel nodes run there); the caller destroys it."""
    cu = backend._cu
    check = backend._check
    capture = backend.create_stream(_partition_of(requests))
    try:
        mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check(cu.cuStreamBeginCapture(capture.native, mode), "cuStreamBeginCapture", LaunchFailed)
        try:
            for request in requests:
                backend.launch(dataclasses.replace(request, stream=capture))
        except BaseException:
            err, graph = cu.cuStreamEndCapture(capture.native)
            if err == cu.CUresult.CUDA_SUCCESS:
                cu.cuGraphDestroy(graph)
            raise
        return check(cu.cuStreamEndCapture(capture.native), "cuStreamEndCapture", LaunchFailed)
    finally:
        backend.destroy_stream(capture)


class GraphLaunch:
    """An instantiated graph of one pipeline launch, made by ``CudaBackend.prepare``.

    Owns its ``CUgraphExec`` and frees it in ``close()`` (idempotent), which must
    come after the work it launched finished or was ordered before any free.
    Launched on whatever stream the caller passes, in that stream's order; its kernels run
    on the SMs of the partition its requests' stream was in, whichever stream that is.
    """

    def __init__(self, backend: _Capturing, requests: Sequence[LaunchRequest]) -> None:
        self._backend = backend
        cu = backend._cu
        graph = _capture(backend, requests)
        try:
            self._exec: Any = backend._check(
                cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate", LaunchFailed
            )
        finally:
            cu.cuGraphDestroy(graph)
        self.stages = len(requests)
        self._stages = tuple(requests)
        """What the instance launches now (``set_scalars`` changes it)."""
        self._whole = _partition_of(requests) is None
        """Whether it runs on the whole device: then ``enqueue`` may launch its stages."""

    @property
    def device_launchable(self) -> bool:
        """Whether ``enqueue`` may capture it for launch from the device: its stages run on
        the whole device (device graph launch and SM partitions do not mix)."""
        return self._whole and self._exec is not None

    def enqueue(self, stream: Stream) -> None:
        """The pipeline's stages, launched one by one on ``stream`` (the device launcher
        captures them into a graph of its own)."""
        if not self.device_launchable:
            raise LaunchFailed("this prepared launch cannot be launched from the device")
        for request in self._stages:
            self._backend.launch(dataclasses.replace(request, stream=stream))

    def launch(self, stream: Stream | None, count: int = 1) -> None:
        """Enqueue the whole pipeline ``count`` times on ``stream``; returns without waiting.

        The lookups are made once for all ``count``: a replayed run is one Python loop
        around ``cuGraphLaunch``."""
        backend = self._backend
        graph_exec = self._exec
        if graph_exec is None:
            raise LaunchFailed("this prepared launch was closed")
        handle = backend._stream_handle(stream)
        graph_launch = backend._cu.cuGraphLaunch
        for _ in range(count):
            err = graph_launch(graph_exec, handle)[0]
            if err:
                raise backend._check.error(err, "cuGraphLaunch", LaunchFailed)

    def set_scalars(self, changes: Sequence[ScalarChange]) -> None:
        """Capture the stages with the new values and update the instance in place (launches
        already enqueued keep theirs); nothing to do where every value is the one it has."""
        graph_exec = self._exec
        if graph_exec is None:
            raise LaunchFailed("this prepared launch was closed")
        stages = with_scalars(self._stages, changes)
        if stages is None:
            return
        backend = self._backend
        graph = _capture(backend, stages)
        try:
            backend._check(
                backend._cu.cuGraphExecUpdate(graph_exec, graph), "cuGraphExecUpdate", LaunchFailed
            )
        finally:
            backend._cu.cuGraphDestroy(graph)
        self._stages = stages

    @property
    def exec_handle(self) -> int:
        """The ``CUgraphExec`` as an integer, for a native engine (0 once closed): valid while
        this is open, which its owner guarantees for as long as an engine may launch it."""
        return 0 if self._exec is None else int(self._exec)

    def close(self) -> None:
        graph_exec, self._exec = self._exec, None
        self._stages = ()
        if graph_exec is not None and not self._backend._closed:
            self._backend._cu.cuGraphExecDestroy(graph_exec)


class DeviceGraph:
    """``INSTANCES`` instances of one graph, instantiated for device launch and uploaded,
    ending in ``accy_done`` for one ring. Made by ``DeviceLauncher.graph``; the caller
    closes it (idempotent) after dropping the tickets that name it."""

    def __init__(self, cu: Any, execs: list[Any]) -> None:
        self._cu = cu
        self.execs = execs

    @property
    def handles(self) -> list[int]:
        return [int(e) for e in self.execs]

    def close(self) -> None:
        execs, self.execs = self.execs, []
        for graph_exec in execs:
            self._cu.cuGraphExecDestroy(graph_exec)
