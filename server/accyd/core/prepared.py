"""Prepared launches: the daemon's one cache of "the same launch again", per session.

What a launch is checked against (the pipeline, the pool, the buffers' sizes and the
runtime scalars) does not change for the same buffers, scratch and scalars, so the
first launch of such a key is planned and prepared once (``Backend.prepare``: a CUDA
graph on the device) and later ones, from every door, replay it. The engine's tickets
(``core/tickets.py``) are views of these entries and die with them.

The one invalidation rule: an entry lives while everything it names does. It is dropped
when a buffer it names is freed or lost (``forget``), and all of a session's are
dropped when its scratch is replaced, when it is released or reloaded, and when its
device is replaced (``clear``); dropping revokes its tickets first (no engine launch
of it can follow), then closes its graph. Buffers freed get new ids, so a dropped key
is never asked for again.

A free runtime scalar (``core/free_scalars.py``) is left out of the key: its entry serves
every value of it, and each launch hands the prepared launch its own values first.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from accyd.backends.base import Backend, LaunchRequest, PreparedLaunch
from accyd.catalog.dtypes import Scalar
from accyd.core.buffers import BufferRecord
from accyd.core.executor import LaunchPlan, PipelineLaunch, check_intermediates, check_pool
from accyd.core.free_scalars import FreeScalars
from accyd.core.tickets import NO_TICKETS, EngineUser, Revoker, revoke

__all__ = ["PREPARED_PER_SESSION", "Prepared", "PreparedLaunches", "prepare_pipeline"]

PREPARED_PER_SESSION = 64
"""Prepared launches a session keeps; past this its cache starts over."""

Key = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[object, ...]]
"""Operand, result and scratch buffer ids, and the scalars (floats by their exact bits;
``None`` for a free one)."""


def key_of(
    operands: Sequence[int],
    results: Sequence[int],
    scratch: Sequence[int],
    args: Sequence[Scalar],
    free: Collection[int] = (),
) -> Key:
    """The cache key of a launch: ``-0.0`` and ``0.0`` are two keys (a graph bakes its
    scalars in), so floats count by their bits. The scalars at ``free`` are left out."""
    scalars = tuple(
        None
        if index in free
        else (s.dtype, s.value.hex() if isinstance(s.value, float) else s.value)
        for index, s in enumerate(args)
    )
    return (tuple(operands), tuple(results), tuple(scratch), scalars)


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
                shared_memory_bytes=stage.shared_memory_bytes,
                diagnostic_id=request.diagnostic_id,
            )
        )
    return backend.prepare(requests)


class Prepared:
    """One entry: a launch planned and packed once, and who may launch it without Python.

    Owned by its session's ``PreparedLaunches``; ``launch`` is closed when the entry is
    dropped, after its tickets were revoked. ``uses`` are the buffer records it reads
    and writes (for the tickets' bookkeeping on them).
    """

    __slots__ = ("epoch", "holder", "launch", "plan", "session", "uses")

    def __init__(
        self,
        session: EngineUser,
        plan: LaunchPlan,
        launch: PreparedLaunch | None,
        uses: tuple[tuple[BufferRecord, bool], ...],
    ) -> None:
        self.session = session
        self.plan = plan
        self.launch = launch
        """``None`` until first launched (a launch on scratch of its own is never prepared)."""
        self.uses = uses
        self.epoch: int | None = None
        """The engine's epoch slot once ticketed."""
        self.holder: object | None = None
        """The ring whose ticket may launch it now (one at a time: a graph is launched by
        one thread at a time)."""


class PreparedLaunches:
    """One session's prepared launches by key; owned by the session, cleared with it.

    Changed under the daemon's lock; ``revoker`` is the engine's (``NO_TICKETS`` without).
    ``free``: the session's free scalars where its backend's prepared launches take new
    values (left out of the keys, handed to each launch).
    """

    __slots__ = ("_backend", "_entries", "_revoker", "free")

    def __init__(
        self, backend: Backend, revoker: Revoker = NO_TICKETS, free: FreeScalars | None = None
    ) -> None:
        self._backend = backend
        self._revoker = revoker
        self.free = free
        self._entries: dict[Key, Prepared] = {}

    def find(self, key: Key) -> Prepared | None:
        return self._entries.get(key)

    def add(self, key: Key, entry: Prepared) -> Prepared:
        if len(self._entries) >= PREPARED_PER_SESSION:
            self.clear()
        self._entries[key] = entry
        return entry

    def launch(self, entry: Prepared, request: PipelineLaunch, count: int = 1) -> None:
        """Launch ``entry`` (preparing its graph on first use) ``count`` times on the
        request's stream, with the request's values of the free scalars. An entry a ticket
        may launch is revoked first: one graph is never launched (or given new values) by
        two threads at once."""
        if entry.holder is not None:
            revoke([entry], self._revoker)
        if entry.launch is None:
            entry.launch = prepare_pipeline(self._backend, request, entry.plan)
        if self.free is not None:
            entry.launch.set_scalars(self.free.changes(request.runtime_scalars))
        entry.launch.launch(request.stream, count)

    def __len__(self) -> int:
        return len(self._entries)

    def forget(self, buffer_id: int) -> None:
        """Drop the entries that name a buffer being freed or lost."""
        stale = [key for key in self._entries if buffer_id in key[0] or buffer_id in key[1]]
        self._drop([self._entries.pop(key) for key in stale])

    def revoke_all(self) -> None:
        """Make every entry's tickets stale, keeping the graphs (the session goes on, or
        its work is still to be waited for before ``clear``)."""
        revoke([e for e in self._entries.values() if e.epoch is not None], self._revoker)

    def clear(self) -> None:
        """Drop every entry (a running graph finishes first: CUDA frees it after)."""
        entries = list(self._entries.values())
        self._entries.clear()
        self._drop(entries)

    def _drop(self, entries: list[Prepared]) -> None:
        if not entries:
            return
        revoke([e for e in entries if e.epoch is not None], self._revoker)
        for entry in entries:
            if entry.epoch is not None:
                self._revoker.free_epoch(entry.epoch)
                entry.epoch = None
            if entry.launch is not None:
                entry.launch.close()
                entry.launch = None
