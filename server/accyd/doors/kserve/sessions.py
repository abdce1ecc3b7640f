"""One KServe client's loaded models: a session each, its scratch, and pooled buffers.

A model's session is loaded once per client (the core keys it by client,
pipeline, version, format and device) and kept; concurrent first requests
share the one load. Scratch is allocated through the core for each new set of
runtime scalars and kept by the session (the core keeps the larger), so a
repeated request allocates nothing. Operand and result buffers come in sets,
one set per request in flight, and go back to the session's pool when the
request is answered: at most ``POOL_SETS`` idle sets are kept, the oldest
freed past that. Every allocation runs on the device-work threads within the
client's share; nothing here waits on the device.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from accyd.catalog.dtypes import DType, Scalar
from accyd.core.interface import Core
from accyd.errors import AccyError
from accyd.scheduling import DeviceWork

__all__ = ["POOL_SETS", "BufferSet", "ModelSession", "ModelSessions"]

POOL_SETS = 8
"""Idle buffer sets a session keeps for the next requests."""
SCRATCH_MEMO = 64
"""Runtime-scalar tuples a session remembers it has scratch for (then it asks the core again)."""

Sizes = tuple[tuple[int, ...], tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class BufferSet:
    """Buffers for one request: an operand buffer each, a result buffer each."""

    sizes: Sizes
    operands: tuple[str, ...]
    results: tuple[str, ...]

    @property
    def ids(self) -> tuple[str, ...]:
        return self.operands + self.results


@dataclass(eq=False)
class ModelSession:
    session_id: str
    needs_scratch: bool
    scratch_for: set[tuple[Scalar, ...]] = field(default_factory=set)
    idle: OrderedDict[int, BufferSet] = field(default_factory=OrderedDict)
    """Idle sets, oldest first (keyed by a counter)."""
    handed: int = 0


class ModelSessions:
    """A client's sessions by (model, version)."""

    def __init__(self, daemon: Core, work: DeviceWork, client_id: str) -> None:
        self.daemon = daemon
        self.work = work
        self.client_id = client_id
        self._sessions: dict[tuple[str, int, int], ModelSession] = {}
        self._loading: dict[tuple[str, int, int], asyncio.Future[ModelSession]] = {}
        self._forgotten = False

    def loaded(self) -> list[tuple[str, int]]:
        """(target, version) of each session loaded (once for all its priorities)."""
        return list(dict.fromkeys(key[:2] for key in self._sessions))

    async def session(
        self, target: str, version: int, needs_scratch: bool, lowered: int = 0
    ) -> ModelSession:
        """The client's session for the model at a priority ``lowered`` levels below its
        tenant's (one per priority asked for), loaded at the first request (compiles)."""
        key = (target, version, lowered)
        found = self._sessions.get(key)
        if found is not None:
            return found
        loading = self._loading.get(key)
        if loading is not None:
            return await asyncio.shield(loading)
        future: asyncio.Future[ModelSession] = asyncio.get_running_loop().create_future()
        self._loading[key] = future
        try:
            loaded = await self.work.run_for(
                self.client_id,
                functools.partial(self.daemon.load_pipeline, lowered=lowered),
                self.client_id,
                target,
                version,
            )
            made = ModelSession(loaded.session_id, needs_scratch)
            self._sessions[key] = made
            future.set_result(made)
            return made
        except BaseException as error:
            future.set_exception(error)
            future.exception()  # retrieved: later awaiters get it, none is logged as lost
            raise
        finally:
            del self._loading[key]

    async def scratch(
        self, session: ModelSession, args: tuple[Scalar, ...], names: Sequence[str]
    ) -> None:
        """Make sure the session has scratch for these scalars (allocated once per new set)."""
        if not session.needs_scratch or args in session.scratch_for:
            return
        scalars = dict(zip(names, args, strict=True))
        await self.work.run_for(
            self.client_id,
            self.daemon.allocate_intermediates,
            self.client_id,
            session.session_id,
            scalars,
        )
        if len(session.scratch_for) >= SCRATCH_MEMO:
            session.scratch_for.clear()
        session.scratch_for.add(args)

    async def take(
        self,
        session: ModelSession,
        operands: Sequence[tuple[int, DType]],
        results: Sequence[tuple[int, DType]],
    ) -> BufferSet:
        """A set of buffers of these sizes: an idle one, else one allocated now."""
        sizes: Sizes = (tuple(s for s, _ in operands), tuple(s for s, _ in results))
        for number, found in session.idle.items():
            if found.sizes == sizes:
                del session.idle[number]
                return found
        return await self.work.run_for(self.client_id, self._allocate, sizes, [*operands, *results])

    def _allocate(self, sizes: Sizes, wanted: Sequence[tuple[int, DType]]) -> BufferSet:
        """*Blocking*: allocate a whole set, or none of it."""
        made: list[str] = []
        try:
            for size, dtype in wanted:
                made.append(self.daemon.allocate_buffer(self.client_id, size, dtype).id)
        except BaseException:
            for buffer_id in made:
                with contextlib.suppress(AccyError):
                    self.daemon.free_buffer(self.client_id, buffer_id)
            raise
        count = len(sizes[0])
        return BufferSet(sizes, tuple(made[:count]), tuple(made[count:]))

    def give(self, session: ModelSession, buffers: BufferSet) -> None:
        """Return a set after its request was answered; the oldest idle set past the pool's
        size is freed (after its users, in the background)."""
        if self._forgotten or self._sessions.get(self._key_of(session)) is not session:
            self._free(buffers)
            return
        session.handed += 1
        session.idle[session.handed] = buffers
        while len(session.idle) > POOL_SETS:
            _, oldest = session.idle.popitem(last=False)
            self._free(oldest)

    def discard(self, buffers: BufferSet) -> None:
        """Free a set whose request failed."""
        self._free(buffers)

    def _key_of(self, session: ModelSession) -> tuple[str, int, int]:
        for key, found in self._sessions.items():
            if found is session:
                return key
        return ("", -1, 0)

    def _free(self, buffers: BufferSet) -> None:
        if self._forgotten:
            return  # the client's detach frees them
        for buffer_id in buffers.ids:
            task = asyncio.ensure_future(self._free_one(buffer_id))
            _BACKGROUND.add(task)
            task.add_done_callback(_BACKGROUND.discard)

    async def _free_one(self, buffer_id: str) -> None:
        with contextlib.suppress(AccyError):
            await self.daemon.free_buffer_async(self.client_id, buffer_id)

    async def unload(self, target: str) -> int:
        """Release every version of ``target`` this client loaded; how many were."""
        keys = [key for key in self._sessions if key[0] == target]
        for key in keys:
            session = self._sessions.pop(key)
            for buffers in session.idle.values():
                for buffer_id in buffers.ids:
                    await self._free_one(buffer_id)
            session.idle.clear()
            with contextlib.suppress(AccyError):
                await self.daemon.release_async(self.client_id, session.session_id)
        return len(keys)

    def forget(self) -> None:
        """The client is being detached: its detach frees everything; nothing more is freed
        or pooled here."""
        self._forgotten = True
        self._sessions.clear()


_BACKGROUND: set[asyncio.Task[None]] = set()
