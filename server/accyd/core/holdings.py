"""What clients hold: sessions and buffers made, charged, waited for and freed.

Each operation that waits for the device (WaitLaunch, Release, FreeBuffer, detach) is built
once as a ``Deferred``: the marks to wait for, and the frees to run after. ``op()`` runs both
on the calling thread (*blocking*); ``op_async()`` awaits the marks' notifications on the
event loop, parking no thread; once begun, it finishes even if its caller goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Protocol

import structlog

from accyd.backends.base import EXPORT_GRANULE, Stream, round_up
from accyd.catalog.dtypes import DType
from accyd.catalog.model import ArtifactFormat, Pipeline, Registry
from accyd.core.buffers import BufferRecord, Transfer
from accyd.core.clients import Client
from accyd.core.executor import load_pipeline_artifacts
from accyd.core.ids import BUFFER, SESSION, new_id
from accyd.core.marks import Mark, order_after
from accyd.core.sessions import Session, SessionKey, pick_format
from accyd.core.tables import Tables
from accyd.core.tenants import Usage
from accyd.core.tickets import absorb
from accyd.core.waits import Deferred, over, until_done
from accyd.errors import AccyError, InvalidRequest

__all__ = ["MAX_BUFFER_BYTES", "ONE_CLIENT", "CatalogView", "Holdings"]

ONE_CLIENT = Usage(clients=1)
"""What an attached client costs its tenant (charged by ``attach``, refunded after its detach)."""

log = structlog.get_logger("accyd.core")

MAX_BUFFER_BYTES = 1 << 40
"""No buffer is larger (1 TiB): a sanity bound before any quota, so no request asks the
backend to allocate and zero absurd sizes."""


EXPORT_DESCRIPTORS = 2
"""What an exportable buffer's memory holds in the daemon: a descriptor, and its mapping's."""


class CatalogView(Protocol):
    """What the core needs of the catalog (``accyd.catalog.Catalog`` fits)."""

    @property
    def registry(self) -> Registry: ...

    @property
    def pipelines(self) -> tuple[Pipeline, ...]: ...

    def find_pipeline(self, target: str, version: int = 0) -> Pipeline: ...

    def formats_of(self, pipeline: Pipeline) -> tuple[ArtifactFormat, ...]: ...


class Holdings:
    """Sessions, buffers and their teardown, over the core's shared ``Tables``."""

    def __init__(self, tables: Tables) -> None:
        self._t = tables
        self._settling: set[asyncio.Task[None]] = set()

    # Sessions -----------------------------------------------------------------

    def load(
        self,
        catalog: CatalogView,
        client_id: str,
        target: str,
        version: int,
        format: ArtifactFormat | None,
        device: int | None,
        lowered: int = 0,
    ) -> tuple[Session, bool]:
        if not target:
            raise InvalidRequest("target is empty", field="target")
        if lowered < 0:
            raise InvalidRequest("a priority is lowered by 0 levels or more", field="priority")
        pipeline = catalog.find_pipeline(target, version)
        device = self._t.place(client_id, device)
        backend = self._t.backend(device)
        fmt = pick_format(pipeline, catalog.formats_of(pipeline), backend, format)
        key = SessionKey(pipeline.target, pipeline.version, fmt, device, lowered)
        with self._t.lock:
            self._t.state.check_serving(device)
            client = self._t.clients.get(client_id)
            existing = client.session_for(key)
            if existing is not None:
                existing.loads += 1
                return existing, False
        with self._t.ledger.reserve(client, Usage(sessions=1)) as held:
            with self._t.state.guard(backend=backend):
                pool = load_pipeline_artifacts(backend, pipeline, catalog.registry, fmt)
                held.undo(pool.close)
                tenant = client.tenant.name
                stream = self._t.partitions.create_stream(backend, device, tenant, lowered)
                held.undo(lambda: backend.destroy_stream(stream))
            session = Session(
                new_id(SESSION),
                key,
                pipeline,
                catalog.registry,
                backend,
                pool,
                stream,
                self._t.revoker,
            )
            with self._t.lock:
                other = client.session_for(key)
                if other is not None:  # loaded meanwhile by another call: this one is undone
                    other.loads += 1
                    return other, False
                self._t.check_attached(client)
                self._t.check_current(device, backend)
                client.add_session(session)
                held.keep()
        return session, True

    def release(self, client_id: str, session_id: str) -> None:
        """*Blocking*: release one load; the last waits for the session's work, then frees
        its pool, scratch and stream (an earlier one returns at once)."""
        self.finish(self._release(client_id, session_id))

    async def release_async(self, client_id: str, session_id: str) -> None:
        """``release``, awaiting the session's work on the event loop."""
        await self.settle(self._release(client_id, session_id))

    def _release(self, client_id: str, session_id: str) -> Deferred | None:
        with self._t.lock:
            client = self._t.clients.get(client_id)
            session = client.session(session_id)
            session.loads -= 1
            if session.loads > 0:
                log.info("session load released", session_id=session_id, loads=session.loads)
                return None
            client.pop_session(session_id)
            session.prepared.revoke_all()  # no engine launch of it after the tail below
            tail = session.pending(None)

        def then() -> None:
            self._close_session(client, session)
            log.info("session released", client_id=client_id, session_id=session_id)

        return Deferred([] if tail is None else [tail], then)

    def _close_session(self, client: Client, session: Session) -> None:
        try:
            with self._t.state.guard(session.id, session.backend):
                session.backend.synchronize(session.stream)
        except AccyError as error:
            log.warning("session work failed", session_id=session.id, error=str(error))
        with self._t.lock:
            memory = session.scratch_bytes()
            drained = session.drain()
            self._t.ledger.refund(
                client, Usage(memory_bytes=memory, sessions=1, launches_in_flight=drained.launches)
            )
        drained.close()
        session.close()

    # Waits ----------------------------------------------------------------------

    def wait_launch(
        self, client_id: str, session_id: str, launch_id: str | None = None, *, reap: bool = True
    ) -> None:
        """*Blocking*: wait for one launch of the session, or for all so far.

        With ``reap`` false, finished launches stay in the session's log until
        ``reap`` (or the session's next launch or wait) drops them: for a caller
        that answers first and tidies after.
        """
        self.finish(self._launch_wait(client_id, session_id, launch_id, reap))

    async def wait_launch_async(
        self, client_id: str, session_id: str, launch_id: str | None = None
    ) -> None:
        """``wait_launch``, awaiting the launch's end on the event loop."""
        await self.settle(self._launch_wait(client_id, session_id, launch_id, True))

    def _launch_wait(
        self, client_id: str, session_id: str, launch_id: str | None, reap: bool
    ) -> Deferred | None:
        with self._t.lock:
            self._t.state.check_alive()
            client, session = self._t.session(client_id, session_id)
            seq = session.launch_seq(launch_id) if launch_id else None
            mark = session.pending(seq)

        def then() -> None:
            if mark is not None:
                self.wait(mark, session)
            if reap:
                self._reap(client, session)

        return Deferred([] if mark is None else [mark], then)

    def reap(self, client_id: str, session_id: str) -> bool:
        """Drop a session's finished launches from its log and give their quota back;
        whether launches are still in its log (a session gone has none).

        Scratch made for one launch alone is freed here; a session released or a
        client detached meanwhile has nothing left to drop. Tidying only, it
        raises nothing: a lost device is reported by the next call.
        """
        with self._t.lock:
            try:
                client, session = self._t.session(client_id, session_id)
            except AccyError:
                return False
        with contextlib.suppress(AccyError):
            self._reap(client, session)
        return session.launches_in_flight > 0

    def _reap(self, client: Client, session: Session) -> None:
        with self._t.lock:
            reaped = session.reap(free_scratch=True)
            self._t.ledger.launches_over(client, reaped.launches, reaped.scratch_bytes)
        reaped.close()

    def wait(self, mark: Mark | None, session: Session) -> None:
        """Block until ``mark``'s work is over; raise its error (the caller releases it)."""
        if mark is not None:
            with self._t.state.guard(session.id, session.backend):
                mark.wait()

    def finish(self, deferred: Deferred | None) -> None:
        if deferred is None:
            return
        try:
            deferred.then()
        finally:
            for mark in deferred.marks:
                mark.release()

    async def settle(self, deferred: Deferred | None) -> None:
        """Await the deferred's marks, then finish it; a cancelled caller does not stop it."""
        if deferred is None:
            return
        if not deferred.marks:
            self.finish(deferred)
            return
        task = asyncio.ensure_future(self._settle_now(deferred))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)
        await asyncio.shield(task)

    async def _settle_now(self, deferred: Deferred) -> None:
        if await until_done(
            deferred.marks, lambda: self._t.state.fault is not None or bool(self._t.state.lost)
        ):
            self.finish(deferred)  # the waits in it are over: it returns at once
        else:  # the device was lost with work queued: what is left may block
            await asyncio.to_thread(self.finish, deferred)

    def wait_idle(self, timeout: float) -> bool:
        """*Blocking*: wait up to ``timeout`` seconds for every launch so far; True if all done."""
        with self._t.lock:
            sessions = [s for client in self._t.clients for s in client.sessions.values()]
            marks = [mark for s in sessions if (mark := s.pending(None)) is not None]
        deadline = time.monotonic() + timeout
        try:
            while not all(mark.done() for mark in marks):
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.005)
            return True
        finally:
            for mark in marks:
                mark.release()

    # Buffers ----------------------------------------------------------------------

    def allocate_buffer(
        self,
        client_id: str,
        byte_size: int,
        dtype: DType | None = None,
        device: int | None = None,
        *,
        exportable: bool = False,
    ) -> BufferRecord:
        r"""*Blocking* (the device may take a while): a buffer of ``byte_size`` bytes;
        ``exportable`` ones are charged in whole ``EXPORT_GRANULE``\ s, as they are made."""
        if not 0 < byte_size <= MAX_BUFFER_BYTES:
            raise InvalidRequest(
                f"byte_size must be 1..{MAX_BUFFER_BYTES}, not {byte_size}", field="byte_size"
            )
        if dtype is not None and byte_size % dtype.itemsize:
            raise InvalidRequest(
                f"byte_size {byte_size} is no whole number of {dtype.value} elements",
                field="byte_size",
            )
        device = self._t.place(client_id, device)
        backend = self._t.backend(device)
        with self._t.lock:
            self._t.state.check_serving(device)
            client = self._t.clients.get(client_id)
        charged = round_up(byte_size, EXPORT_GRANULE) if exportable else byte_size
        fds = EXPORT_DESCRIPTORS if exportable else 0
        usage = Usage(memory_bytes=charged, buffers=1, descriptors=fds)
        with self._t.ledger.reserve(client, usage) as held:
            with self._t.state.guard(backend=backend):
                buffer = backend.allocate_buffer(
                    byte_size,
                    zero=True,  # memory is reused between clients: never show old data
                    dtype=dtype,
                    element_count=None if dtype is None else byte_size // dtype.itemsize,
                    exportable=exportable,
                )
            held.undo(lambda: backend.destroy(buffer))
            record = BufferRecord(new_id(BUFFER), device, buffer, backend, dtype, charged, fds)
            with self._t.lock:
                self._t.check_attached(client)
                self._t.check_current(device, backend)
                client.buffers[record.id] = record
                held.keep()
        return record

    def open_transfer(self, client_id: str, buffer_id: str, *, writing: bool) -> Transfer:
        """A streamed write or read, ordered after the buffer's hazards (the engine's too)."""
        with self._t.lock:
            if writing:
                self._t.state.check_serving()
            else:
                self._t.state.check_alive()
            client = self._t.clients.get(client_id)
            record = client.buffer(buffer_id)
            self._t.state.check_alive(record.device)
            backend = record.backend
            with self._t.state.guard(backend=backend):
                stream = self._transfer_stream(client, record.device)
                if record.engine:  # engine launches enqueued so far come first too
                    absorb(record, self._t.revoker)
                hazards = record.write_hazards() if writing else record.read_hazards()
                order_after(backend, stream, hazards)
                waits = [mark.retain() for mark in hazards if not over(mark)]
        return Transfer(
            backend,
            record,
            stream,
            self._t.lock,
            writing=writing,
            waits=waits,
            lost=self.device_gone,
        )

    def device_gone(self) -> bool:
        """Whether a device was lost (its work may never end, its notifications never come)."""
        return self._t.state.fault is not None or bool(self._t.state.lost)

    def _transfer_stream(self, client: Client, device: int) -> Stream:
        stream = client.transfer_streams.get(device)
        if stream is None:
            stream = client.transfer_streams[device] = self._t.backends[device].create_stream()
        return stream

    def free_buffer(self, client_id: str, buffer_id: str) -> None:
        """*Blocking*: wait for the work that uses the buffer, then free it."""
        self.finish(self._free_buffer(client_id, buffer_id))

    async def free_buffer_async(self, client_id: str, buffer_id: str) -> None:
        """``free_buffer``, awaiting the buffer's users on the event loop."""
        await self.settle(self._free_buffer(client_id, buffer_id))

    def _free_buffer(self, client_id: str, buffer_id: str) -> Deferred:
        with self._t.lock:
            client = self._t.clients.get(client_id)
            record = client.buffer(buffer_id)
            del client.buffers[buffer_id]
            for session in client.sessions.values():  # no ticket names it after this
                session.prepared.forget(record.buffer.id)
        marks = self._take(record)
        return Deferred(marks, lambda: self._free(client, record, marks))

    def _take(self, record: BufferRecord) -> list[Mark]:
        """Close ``record`` to transfers; the marks of its users (the engine's included),
        handed over."""
        with record.lock:
            record.closed = True
        with self._t.lock:
            if record.engine:
                absorb(record, self._t.revoker)
            return record.take_marks()

    def _free(self, client: Client, record: BufferRecord, marks: list[Mark]) -> None:
        for mark in marks:
            with contextlib.suppress(AccyError):
                mark.wait()
        record.backend.destroy(record.buffer)
        self._t.ledger.refund(
            client, Usage(memory_bytes=record.charged, buffers=1, descriptors=record.descriptors)
        )

    # Detach ---------------------------------------------------------------------

    def detach(self, client_id: str) -> None:
        """*Blocking*: free everything the client owns once its running work finished."""
        self.finish(self._detach(client_id))

    async def detach_async(self, client_id: str) -> None:
        """``detach``, awaiting the client's running work on the event loop."""
        await self.settle(self._detach(client_id))

    def _detach(self, client_id: str) -> Deferred | None:
        """Forget the client at once; drop its queued kernels where the backend can."""
        with self._t.lock:
            client = self._t.clients.leave(client_id)
            if client is None:
                return None
            sessions = list(client.sessions.values())
            tails = [mark for s in sessions if (mark := s.pending(None)) is not None]
        for session in sessions:
            with contextlib.suppress(AccyError):
                session.backend.drop_queued(session.stream)
        taken = {record.id: self._take(record) for record in list(client.buffers.values())}

        def then() -> None:
            for session in sessions:
                self._close_session(client, session)
            for record in list(client.buffers.values()):
                self._free(client, record, taken[record.id])
            for device, stream in list(client.transfer_streams.items()):
                backend = self._t.backends[device]
                with contextlib.suppress(AccyError), self._t.state.guard(backend=backend):
                    backend.synchronize(stream)
                backend.destroy_stream(stream)
            with self._t.lock:
                client.sessions.clear()
                client.session_ids.clear()
                client.buffers.clear()
                client.transfer_streams.clear()
                self._t.clients.gone(client)
            self._t.ledger.refund(client, ONE_CLIENT)
            log.info(
                "client detached", client_id=client.id, sessions=len(sessions), buffers=len(taken)
            )

        marks = tails + [mark for held in taken.values() for mark in held]
        return Deferred(marks, then)
