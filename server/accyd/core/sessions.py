"""Sessions: one client's loaded pipeline, its own stream, its scratch and its launch log.

A session is one row of the session table, keyed by (client, target, version,
format, device). Its launches run in arrival order on its stream; each is
recorded with a mark so a later ``WaitLaunch`` can wait for it. Launch ids
carry a per-session random tag and a sequence number, so any id this session
handed out can be answered after its record was reaped.
"""

from __future__ import annotations

import contextlib
import secrets
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from accyd.backends.base import Backend, DeviceBuffer, Stream
from accyd.catalog.dtypes import Scalar
from accyd.catalog.model import ArtifactFormat, Pipeline, Registry, ScalarSpec
from accyd.core.executor import (
    ArtifactPool,
    Intermediates,
    LaunchPlan,
    PipelineLaunch,
    intermediate_byte_sizes,
    launch_pipeline,
    plan_launch,
)
from accyd.core.free_scalars import free_scalars_of
from accyd.core.ids import LAUNCH
from accyd.core.marks import Mark
from accyd.core.prepared import Key, Prepared, PreparedLaunches, key_of
from accyd.core.tickets import NO_TICKETS, Revoker
from accyd.errors import (
    AccyError,
    FailedPrecondition,
    InvalidArtifact,
    LaunchArgumentMismatch,
    NotFound,
    UnsupportedOperation,
)

__all__ = [
    "LaunchRecord",
    "LoadedSession",
    "Reaped",
    "Session",
    "SessionKey",
    "order_scalars",
    "pick_format",
]

_CHECKS = (LaunchArgumentMismatch, InvalidArtifact, FailedPrecondition)
"""What the executor raises from its checks, before anything was launched."""


@dataclass(frozen=True, slots=True)
class SessionKey:
    """The session table's key within one client."""

    target: str
    version: int
    format: ArtifactFormat
    device: int
    lowered: int = 0
    """Priority levels below its tenant's (a KServe request's ``priority``)."""


@dataclass(frozen=True, slots=True)
class LoadedSession:
    """What a load answers: the session, whether it was made now, what it runs, where."""

    session_id: str
    created: bool
    pipeline: Pipeline
    format: ArtifactFormat
    device: int


@dataclass(eq=False, slots=True)
class LaunchRecord:
    """One launch in flight: its sequence number, its end mark, and scratch made for it alone."""

    seq: int
    mark: Mark
    scratch: Intermediates | None = None
    launches: int = 1
    """Launches the record stands for: a replayed batch is one record."""

    @property
    def scratch_bytes(self) -> int:
        return 0 if self.scratch is None else self.scratch.byte_size


@dataclass(frozen=True, slots=True)
class Reaped:
    """Launches found finished: how many, and the scratch they leave to free."""

    launches: int = 0
    scratch: tuple[Intermediates, ...] = ()

    @property
    def scratch_bytes(self) -> int:
        return sum(item.byte_size for item in self.scratch)

    def close(self) -> None:
        for item in self.scratch:
            item.close()


class Session:
    """A loaded pipeline on its own stream. State changes happen under the daemon's lock."""

    def __init__(
        self,
        session_id: str,
        key: SessionKey,
        pipeline: Pipeline,
        registry: Registry,
        backend: Backend,
        pool: ArtifactPool,
        stream: Stream,
        revoker: Revoker = NO_TICKETS,
    ) -> None:
        self.id = session_id
        self.key = key
        self.pipeline = pipeline
        self.registry = registry
        self.backend = backend
        self.pool = pool
        self.stream = stream
        self._scratch: Intermediates | None = None
        self._scratch_fits: tuple[Scalar, ...] | None = None
        """The last runtime scalars the scratch was found large enough for."""
        self.loads = 1
        """Loads of this session by its client not yet released; the last release frees it."""
        self._tag = secrets.token_urlsafe(6)
        self._next_seq = 1
        self._inflight: deque[LaunchRecord] = deque()
        free = (
            free_scalars_of(pipeline, registry, key.format)
            if backend.prepared_takes_scalars
            else None
        )
        self.prepared = PreparedLaunches(backend, revoker, free)
        """Launches checked and packed once (CUDA graphs), replayed for the same arguments
        (whatever the values of free scalars, where the backend takes them anew)."""
        self._completed = 0
        """Every launch with a sequence number up to this one has finished."""
        self.engine_touched = False
        """An engine ticket may have launched on its stream: its pending work is asked of
        the stream itself (a fresh mark), not of its log alone."""
        self.closed = False

    # Launch ids ---------------------------------------------------------------

    def launch_id(self, seq: int) -> str:
        return f"{LAUNCH}_{self._tag}.{seq}"

    def launch_seq(self, launch_id: str) -> int:
        """The sequence number of a launch id this session handed out, else ``NotFound``."""
        prefix = f"{LAUNCH}_{self._tag}."
        digits = launch_id[len(prefix) :] if launch_id.startswith(prefix) else ""
        if not digits.isdigit() or not 0 < int(digits) < self._next_seq:
            raise NotFound(f"session {self.id} has no launch {launch_id!r}", field="launch_id")
        return int(digits)

    # Scratch ------------------------------------------------------------------

    @property
    def scratch(self) -> Intermediates | None:
        """Scratch from AllocateIntermediates, kept across launches; ``None`` if never asked."""
        return self._scratch

    @scratch.setter
    def scratch(self, value: Intermediates | None) -> None:
        self._scratch = value
        self._scratch_fits = None
        self.prepared.clear()  # they name the old scratch

    @property
    def needs_scratch(self) -> bool:
        return bool(self.pipeline.intermediates)

    def scratch_for(self, args: Sequence[Scalar]) -> Intermediates | None:
        """The session's scratch if it is large enough for ``args``; ``None`` if it has none."""
        if self.scratch is None:
            return None
        if args == self._scratch_fits:
            return self.scratch
        needed = intermediate_byte_sizes(self.pipeline, args)
        have = [buffer.byte_size for buffer in self.scratch.buffers]
        if any(n > h for n, h in zip(needed, have, strict=True)):
            raise FailedPrecondition(
                f"session {self.id}'s scratch holds {have} bytes; these runtime scalars need "
                f"{needed}: call AllocateIntermediates with the larger runtime scalars first",
                field="runtime_scalars",
            )
        self._scratch_fits = tuple(args)
        return self.scratch

    def scratch_bytes(self) -> int:
        held = 0 if self.scratch is None else self.scratch.byte_size
        return held + sum(record.scratch_bytes for record in self._inflight)

    # Launches -----------------------------------------------------------------

    @property
    def launches_in_flight(self) -> int:
        return len(self._inflight)

    def cache_key(
        self,
        operands: Sequence[DeviceBuffer],
        results: Sequence[DeviceBuffer],
        args: Sequence[Scalar],
    ) -> Key | None:
        """The prepared-launch key of a launch on the session's own scratch, or ``None`` for
        one that needs scratch made for it alone (never prepared)."""
        scratch = self.scratch
        if scratch is None and self.needs_scratch:
            return None
        free = self.prepared.free
        return key_of(
            [b.id for b in operands],
            [b.id for b in results],
            [] if scratch is None else [b.id for b in scratch.buffers],
            args,
            () if free is None else free.indices,
        )

    def plan(
        self,
        operands: Sequence[DeviceBuffer],
        results: Sequence[DeviceBuffer],
        args: Sequence[Scalar],
    ) -> LaunchPlan:
        """Check a launch against the pipeline: counts, scalars, and buffers that hold enough."""
        return plan_launch(self.pipeline, self.registry, self.key.format, operands, results, args)

    def enqueue(
        self,
        operands: Sequence[DeviceBuffer],
        results: Sequence[DeviceBuffer],
        args: Sequence[Scalar],
        transient: Intermediates | None,
        plan: LaunchPlan | None = None,
        entry: Prepared | None = None,
    ) -> LaunchRecord:
        """Enqueue one launch on the session's stream; returns once enqueued.

        ``entry`` is the prepared launch of a launch on the session's own scratch (replayed);
        ``transient`` is scratch made for this launch alone, freed when it is reaped;
        ``plan`` what ``plan`` returned for the same buffers (``None``: planned here). A
        launch that fails after its checks still leaves a record (the newest), so what it
        may have touched is waited for before it is freed.
        """
        scratch = transient if transient is not None else self.scratch
        request = PipelineLaunch(
            pipeline=self.pipeline,
            registry=self.registry,
            format=self.key.format,
            operands=operands,
            results=results,
            runtime_scalars=args,
            intermediates=() if scratch is None else scratch.buffers,
            artifacts=self.pool,
            stream=self.stream,
            diagnostic_id=self.id,
        )
        try:
            if entry is not None:
                self.prepared.launch(entry, request)
            else:
                launch_pipeline(self.backend, request, plan)
        except _CHECKS:
            if transient is not None:
                transient.close()
            raise
        except BaseException:
            with contextlib.suppress(AccyError):
                self._push(transient)
            raise
        return self._push(transient)

    def _push(self, scratch: Intermediates | None, launches: int = 1) -> LaunchRecord:
        record = LaunchRecord(self._next_seq, Mark(self.backend, self.stream), scratch, launches)
        self._next_seq += 1
        self._inflight.append(record)
        return record

    def newest(self, since_seq: int) -> LaunchRecord | None:
        """The newest record if it was pushed at or after ``since_seq``."""
        if self._inflight and self._inflight[-1].seq >= since_seq:
            return self._inflight[-1]
        return None

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def pending(self, seq: int | None) -> Mark | None:
        """A retained mark for launch ``seq`` (the newest if ``None``); ``None`` once done.

        The newest of a session an engine ticket may have launched on is a fresh mark on
        its stream: it covers the engine's launches enqueued so far too."""
        if seq is None and self.engine_touched and not self.closed:
            return Mark(self.backend, self.stream)
        if not self._inflight:
            return None
        if seq is None:
            return self._inflight[-1].mark.retain()
        if seq <= self._completed:
            return None
        return self._inflight[seq - self._inflight[0].seq].mark.retain()

    def reap(self, *, free_scratch: bool) -> Reaped:
        """Drop finished launches from the front of the log (they finish in stream order).

        With ``free_scratch`` false it stops at a launch holding transient
        scratch, so the (possibly slow) free happens on a thread that may block.
        """
        count = 0
        scratch: list[Intermediates] = []
        while self._inflight and self._inflight[0].mark.done():
            if self._inflight[0].scratch is not None and not free_scratch:
                break
            record = self._inflight.popleft()
            self._completed = record.seq
            record.mark.release()
            if record.scratch is not None:
                scratch.append(record.scratch)
            count += record.launches
        return Reaped(count, tuple(scratch))

    def drain(self) -> Reaped:
        """Forget every launch (the caller waited for the stream); hands over their scratch."""
        records = list(self._inflight)
        self._inflight.clear()
        for record in records:
            record.mark.release()
        self._completed = self._next_seq - 1
        return Reaped(
            sum(r.launches for r in records),
            tuple(r.scratch for r in records if r.scratch is not None),
        )

    def close(self) -> None:
        """Free the pool, the scratch and the stream; the caller waited and drained first."""
        self.closed = True
        self.prepared.clear()
        self.pool.close()
        if self.scratch is not None:
            self.scratch.close()
            self.scratch = None
        self.backend.destroy_stream(self.stream)


def order_scalars(pipeline: Pipeline, given: Mapping[str, Scalar]) -> tuple[Scalar, ...]:
    """The runtime scalars in the pipeline's order, from a map by declared name.

    An unknown or missing name is refused naming the field; a value of another
    type of the same kind (an integer for a u32) is converted if it fits.
    """
    declared = {spec.name for spec in pipeline.runtime_scalars}
    for name in given:
        if name not in declared:
            names = ", ".join(sorted(declared)) or "none"
            raise LaunchArgumentMismatch(
                f"{pipeline.target} has no runtime scalar {name!r} (it takes {names})",
                field=f"runtime_scalars.{name}",
            )
    ordered = []
    for spec in pipeline.runtime_scalars:
        if spec.name not in given:
            raise LaunchArgumentMismatch(
                f"{pipeline.target} needs runtime scalar {spec.name!r} ({spec.dtype.value})",
                field=f"runtime_scalars.{spec.name}",
            )
        ordered.append(_coerce(given[spec.name], spec))
    return tuple(ordered)


def _coerce(value: Scalar, spec: ScalarSpec) -> Scalar:
    if value.dtype is spec.dtype:
        return value
    field = f"runtime_scalars.{spec.name}"
    if spec.dtype.is_integer and not value.dtype.is_integer:
        raise LaunchArgumentMismatch(
            f"runtime scalar {spec.name!r} is {spec.dtype.value}; got {value.dtype.value}",
            field=field,
        )
    try:
        return Scalar(spec.dtype, value.value)
    except LaunchArgumentMismatch as error:
        raise LaunchArgumentMismatch(
            f"runtime scalar {spec.name!r}: {error.message}", field=field
        ) from None


def pick_format(
    pipeline: Pipeline,
    available: tuple[ArtifactFormat, ...],
    backend: Backend,
    wanted: ArtifactFormat | None,
) -> ArtifactFormat:
    """The format a session of ``pipeline`` loads on ``backend``: ``wanted``, else the first
    of ``available`` the backend loads; ``UnsupportedOperation`` naming both otherwise."""
    loadable = [f for f in available if f in backend.formats]
    if wanted is None and loadable:
        return loadable[0]
    if wanted is not None and wanted in loadable:
        return wanted
    has = ", ".join(f.value for f in available)
    loads = ", ".join(sorted(f.value for f in backend.formats))
    which = "" if wanted is None else f" as {wanted.value}"
    raise UnsupportedOperation(
        f"{pipeline.target} cannot run{which} here: it exists as {has}; "
        f"the {backend.kind.value} backend loads {loads}",
        field="format",
    )
