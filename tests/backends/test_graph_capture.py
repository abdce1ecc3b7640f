"""A prepared launch's graph is captured in its stream's SM partition (no GPU: a fake driver).

A CUDA graph's kernel nodes keep the context of the stream they were captured on: captured
on a primary-context stream, a confined tenant's replays ran on every SM of an H200 even on
its green context's stream (bench/contention.py: the aggressor's 2 ms kernels as long in a
112-SM partition as on all 132 SMs, the victim's p99 50x its p99 alone).
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import pytest

from accyd.backends.base import LaunchRequest, LoadedKernel, Stream
from accyd.backends.cuda.driver import ErrorCheck
from accyd.backends.cuda.graphs import GraphLaunch
from accyd.catalog.entries import FixedGeometry


class _Driver:
    """The driver calls a capture makes, each succeeding."""

    CUstreamCaptureMode = SimpleNamespace(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL=1)

    def cuStreamBeginCapture(self, stream: Any, mode: int) -> tuple[int]:
        return (0,)

    def cuStreamEndCapture(self, stream: Any) -> tuple[int, str]:
        return (0, "graph")

    def cuGraphInstantiate(self, graph: Any, flags: int) -> tuple[int, int]:
        return (0, 7)

    def cuGraphDestroy(self, graph: Any) -> tuple[int]:
        return (0,)

    def cuGraphExecDestroy(self, graph_exec: Any) -> tuple[int]:
        return (0,)


class _Backend:
    """What ``GraphLaunch`` uses of ``CudaBackend``, recording its streams and launches."""

    def __init__(self) -> None:
        self._cu = _Driver()
        self._check = ErrorCheck(0, "fake device 0")
        self._closed = False
        self._ids = itertools.count(100)
        self.made: list[Stream] = []
        self.destroyed: list[Stream] = []
        self.launched_on: list[Stream | None] = []

    def create_stream(self, partition: str | None = None, priority: int = 0) -> Stream:
        stream = Stream(next(self._ids), native=object(), partition=partition)
        self.made.append(stream)
        return stream

    def destroy_stream(self, stream: Stream) -> None:
        self.destroyed.append(stream)

    def launch(self, request: LaunchRequest) -> None:
        self.launched_on.append(request.stream)

    def _stream_handle(self, stream: Stream | None) -> Any:
        return None if stream is None else stream.native


def _requests(stream: Stream | None, count: int = 2) -> list[LaunchRequest]:
    kernel = LoadedKernel(1, "k")
    geometry = FixedGeometry((1, 1, 1), (32, 1, 1))
    return [LaunchRequest(None, kernel, [], [], geometry, stream) for _ in range(count)]


@pytest.mark.parametrize("partition", ["batch", None])
def test_the_graph_is_captured_on_a_stream_of_its_partition(partition: str | None) -> None:
    backend = _Backend()
    session_stream = Stream(1, native=object(), partition=partition)
    graph = GraphLaunch(backend, _requests(session_stream))
    (capture,) = backend.made
    assert capture.partition == partition
    assert backend.launched_on == [capture, capture]  # every stage captured there
    assert backend.destroyed == [capture]
    graph.close()


def test_requests_without_a_stream_are_captured_on_the_whole_device() -> None:
    backend = _Backend()
    GraphLaunch(backend, _requests(None, 1)).close()
    assert [s.partition for s in backend.made] == [None]
