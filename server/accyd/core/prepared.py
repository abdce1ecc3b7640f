"""Prepared launches: a session's launch checked and packed once, then replayed by one call.

What a launch is checked against (the pipeline, the pool, the buffers' sizes
and the runtime scalars) does not change for the same buffers and scalars, so
the first launch of a key prepares it (``Backend.prepare``: a CUDA graph on the
device) and later ones replay it. A prepared launch names buffer addresses:
its session drops it when its scratch changes and when it closes; buffers the
client frees get new ids, so their keys are never asked for again.
"""

from __future__ import annotations

from accyd.backends.base import Backend, LaunchRequest, PreparedLaunch
from accyd.catalog.dtypes import Scalar
from accyd.core.executor import LaunchPlan, PipelineLaunch, check_intermediates, check_pool

__all__ = ["PREPARED_PER_SESSION", "PreparedLaunches", "prepare_pipeline"]

PREPARED_PER_SESSION = 64
"""Prepared launches a session keeps; past this its cache starts over."""

_Key = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[Scalar, ...]]


def prepare_pipeline(backend: Backend, request: PipelineLaunch, plan: LaunchPlan) -> PreparedLaunch:
    """Check a pooled launch on provided scratch and pack it for replay.

    ``plan`` is what ``plan_launch`` returned for the same request (checked
    already); the pool and the scratch are checked here, as ``launch_pipeline``
    checks them. The caller owns the result and closes it.
    """
    if request.artifacts is None or request.intermediates is None:
        raise ValueError("only a pooled launch on provided intermediates can be prepared")
    check_pool(request.artifacts, request)
    check_intermediates(request, plan, request.intermediates)
    groups = (request.operands, request.results, request.intermediates)
    requests = []
    for stage, pool_entry in zip(plan.stages, request.artifacts.entries, strict=True):
        requests.append(
            LaunchRequest(
                artifact=pool_entry.artifact,
                loaded=pool_entry.loaded,
                buffers=[groups[group][at] for group, at in stage.buffers],
                scalars=stage.scalars,
                geometry=stage.geometry,
                stream=request.stream,
                shared_memory_bytes=stage.entry.shared_memory_bytes,
                diagnostic_id=request.diagnostic_id,
            )
        )
    return backend.prepare(requests)


class PreparedLaunches:
    """One session's prepared launches by key; owned by the session, closed with it."""

    __slots__ = ("_backend", "_prepared", "generation")

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._prepared: dict[_Key, PreparedLaunch] = {}
        self.generation = 0
        """Moves whenever a prepared launch is closed: one held outside (a bound launch's)
        is valid while the generation it was taken at is the current one."""

    def get(self, request: PipelineLaunch, plan: LaunchPlan) -> PreparedLaunch:
        """The prepared launch of ``request``, made (checked and packed) if its key is new."""
        key: _Key = (
            tuple(b.id for b in request.operands),
            tuple(b.id for b in request.results),
            tuple(b.id for b in request.intermediates or ()),
            tuple(request.runtime_scalars),
        )
        prepared = self._prepared.get(key)
        if prepared is None:
            prepared = prepare_pipeline(self._backend, request, plan)
            if len(self._prepared) >= PREPARED_PER_SESSION:
                self.clear()
            self._prepared[key] = prepared
        return prepared

    def launch(self, request: PipelineLaunch, plan: LaunchPlan) -> None:
        """Launch ``request`` on its stream, preparing it first if its key is new."""
        self.get(request, plan).launch(request.stream)

    def __len__(self) -> int:
        return len(self._prepared)

    def forget(self, buffer_id: int) -> None:
        """Drop the prepared launches that name a buffer being freed (they would keep its
        memory alive on the host backend, and name a dead address on the device)."""
        stale = [key for key in self._prepared if buffer_id in key[0] or buffer_id in key[1]]
        for key in stale:
            self._prepared.pop(key).close()
        if stale:
            self.generation += 1

    def clear(self) -> None:
        """Drop every prepared launch (a running graph finishes first: CUDA frees it after)."""
        for prepared in self._prepared.values():
            prepared.close()
        self._prepared.clear()
        self.generation += 1
