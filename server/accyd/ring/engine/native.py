"""The native engine: C threads launch ticketed records; one Python thread decides the rest.

``NativeEngine`` owns the C engine (``_native.Engine``), one driver table per device
(``drivers``), and the *slow thread*: it takes the records the C threads hand over
(first sight, binds, copies, refusals, faults), has their ``ServerRing`` decide them
through the core, installs the tickets the core allows, and resumes the ring. It is
the core's ``Revoker`` (epoch slots, revocation with a barrier) and its
``EngineCounts`` (in-flight counters per client and tenant, against the ledger's
limits). It owns the rings added to it and closes each once the C threads let it go.
With ``device_launch`` it also owns the device launcher's part (``device_rings``): the GPU
itself launches the ticketed records of the rings it serves.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import structlog

from accyd.backends.base import Backend
from accyd.core.clients import Client
from accyd.core.device import DeviceHealth
from accyd.core.interface import UNKNOWN_PIPELINE, Core
from accyd.core.tenants import Tenant
from accyd.errors import AccyError, DeviceFault, LaunchFailed
from accyd.ring.engine import _native
from accyd.ring.engine.device_rings import DeviceLaunch, DeviceRings, Served
from accyd.ring.engine.drivers import Driver, driver_for, engine_ticket
from accyd.ring.engine.pyloop import FLIGHT_SPIN_SECONDS, IDLE_SPIN_SECONDS
from accyd.ring.observer import RingObserver
from accyd.ring.records import KEY, KEY_END
from accyd.ring.ring import Handled, Pending, ServerRing

__all__ = ["HOUSEKEEPING_SECONDS", "NativeEngine"]

log = structlog.get_logger("accyd.ring.engine")

HOUSEKEEPING_SECONDS = 0.05
"""How often the slow thread tells the core which clients' rings moved (liveness), counts
ticketed launches for metrics and reaps sessions Python launched on."""
NO_COUNTER = 0xFFFFFFFF
"""A counter index the C engine takes as none (past ``COUNTERS``: the limit holds on the
Python path only)."""
EPOCHS = 1 << 18
COUNTERS = 1 << 16
TOKENS = 1 << 16


@dataclass(eq=False, slots=True)
class _Ring:
    ring: ServerRing
    index: int
    reap: set[str] = field(default_factory=set)
    """Sessions Python launched on through this ring: reaped until their logs are empty."""


class NativeEngine:
    """The C engine and its Python side; made by ``accyd.ring.engine.open_engine``."""

    kind = "native"

    def __init__(
        self,
        core: Core,
        *,
        threads: int = 1,
        max_threads: int | None = None,
        batch: int = 64,
        spin_seconds: float = IDLE_SPIN_SECONDS,
        flight_spin_seconds: float = FLIGHT_SPIN_SECONDS,
        observer: RingObserver | None = None,
        launches_per_client: int | None = None,
        timings: bool = False,
        device_launch: DeviceLaunch = "off",
        whole_device: Callable[[str], bool] | None = None,
    ) -> None:
        """``device_launch``: when the GPU launches the ticketed records of the rings whose
        clients asked for it, of tenants that ``whole_device`` says run on the whole device
        (no SM partition), with no in-flight quota (``device_rings``)."""
        self._core = core
        self._observer = observer
        self._launches_per_client = launches_per_client
        self.max_threads = max(threads, max_threads or threads)
        self._engine = _native.Engine(
            threads=self.max_threads,
            base=threads,
            batch=batch,
            epochs=EPOCHS,
            counters=COUNTERS,
            tokens=TOKENS,
            spin_ns=int(spin_seconds * 1e9),
            flight_spin_ns=int(flight_spin_seconds * 1e9),
            timings=timings,
        )
        self.threads = threads
        self._drivers: dict[int, Driver] = {}
        for device, backend in core.backends.items():
            driver = driver_for(backend)
            self._engine.set_driver(device, driver.kind, **driver.table())
            self._drivers[device] = driver
        self._lock = threading.Lock()
        self._rings: dict[int, _Ring] = {}
        self._ring_ids = itertools.count(1)
        # Epoch slots and counters are handed out without a lock (list.pop and append, and
        # next() of a count, are atomic): the core asks for them under its own lock, and a
        # client's counter comes back from a finalizer, which may run anywhere.
        self._epochs: list[int] = []
        self._new_epochs = itertools.count()
        self._counters = itertools.count()
        self._free_counters: list[int] = []
        self._tokens: dict[str, int] = {}
        self._sessions: dict[int, tuple[str, str, int]] = {}
        """token -> (client id, session id, device)."""
        self._free_tokens: list[int] = []
        self._next_token = 0
        self._stopping = False
        self._whole_device = whole_device or (lambda tenant: True)
        served = None if device_launch == "off" else DeviceRings(self._engine, core, device_launch)
        self._device = served if served is not None and served.serving is not None else None
        self._thread = threading.Thread(target=self._run, name="accyd-engine-slow", daemon=True)
        core.attach_engine(self, self, self._watch)

    # Lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        self._engine.start()
        self._thread.start()

    def crowded(self, crowded: bool) -> None:
        """Every one of ``max_threads`` serves its own lane while crowded; else the first
        ``threads`` serve them all (each ring is on the lane holding the fewest). With
        ``--device-launch crowd`` the GPU serves the rings while crowded."""
        self._engine.crowded = crowded
        if self._device is not None:
            self._device.crowded(crowded)

    def watch_served(self, told: Served) -> None:
        """``told`` hears whether the GPU serves a ring, each time that changes."""
        if self._device is not None:
            self._device.on_served = told

    def close(self) -> None:
        """Stop the threads and close every ring still held; idempotent."""
        if self._stopping:
            return
        self._stopping = True
        if self._thread.is_alive():
            self._thread.join(5.0)
        self._engine.stop()
        log.info("ring engine stopped", **self.stats())
        if self._device is not None:  # first: it holds the rings' memory registered
            self._device.close()
        with self._lock:
            rings, self._rings = list(self._rings.values()), {}
        for entry in rings:
            entry.ring.close()

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = self._engine.stats()
        if self._device is not None:
            stats["device_launcher"] = self._device.stats()
        return stats

    def settled(self) -> bool:
        with self._lock:
            rings = [entry.ring for entry in self._rings.values()]
        return all(ring.settled() for ring in rings)

    # Rings ------------------------------------------------------------------------------

    def add(self, ring: ServerRing, *, notify_always: bool = False) -> None:
        """Take ``ring``'s records from now on (and own it)."""
        client = self._core.client(ring.client_id)
        memory = ring.memory
        counters = (self._counter_of(client), self._counter_of_tenant(client.tenant))
        self.published(client)
        with self._lock:
            index = next(self._ring_ids)
            self._rings[index] = _Ring(ring, index)
            ring.engine_index = index
        device = self._device
        servable = (
            ring.device_waits
            and not notify_always
            and client.tenant.quotas.launches_in_flight is None
            and self._whole_device(client.tenant.name)
        )
        served = device is not None and device.added(index, ring, servable)
        try:
            self._engine.add_ring(
                index,
                memory.map,
                memory.slot_count,
                memory.submit_fd,
                memory.complete_fd,
                counters,
                notify_always,
                device=served,
            )
        except BaseException:
            if device is not None:
                device.removed(index)
            raise

    def remove(self, ring: ServerRing) -> None:
        """Let ``ring`` go: returns once no engine thread holds it, then closes it."""
        index = ring.engine_index
        with self._lock:
            entry = self._rings.pop(index, None)
        if entry is None:  # never taken: nothing of the engine's holds it
            ring.close()
            return
        ring.memory.mark_closed()
        self._engine.remove_ring(index)
        if self._device is not None:
            self._device.removed(index)
        ring.close()

    def close_client(self, client_id: str) -> None:
        """Nothing: the doors remove a client's rings, and its counter goes with it."""

    def device_replaced(self, device: int, backend: Backend) -> None:
        """``backend`` serves ``device`` now: launches there may go on (new tickets only: the
        old ones were revoked with the device's sessions)."""
        driver = self._drivers.get(device)
        if driver is not None:
            driver.retarget(backend)
            self._engine.set_device_ok(device, True)

    # The core's Revoker ---------------------------------------------------------------

    ticketing = True

    def new_epoch(self) -> int | None:
        try:
            return self._epochs.pop()
        except IndexError:
            epoch = next(self._new_epochs)
            return epoch if epoch < EPOCHS else None

    def epoch_value(self, epoch: int) -> int:
        return self._engine.epoch(epoch)

    def revoke(self, epochs: Collection[int]) -> None:
        for epoch in epochs:
            self._engine.bump(epoch)
        self._engine.quiesce()
        if self._device is not None:  # after the engine's: see device_serving
            self._device.revoke(epochs)

    def free_epoch(self, epoch: int) -> None:
        self._epochs.append(epoch)

    def quiesce(self) -> None:
        self._engine.quiesce()

    # The ledger's EngineCounts ----------------------------------------------------------

    def in_flight(self, client: Client) -> tuple[int, int]:
        mine, tenant = client.counter, client.tenant.counter
        return (
            0 if not 0 <= mine < COUNTERS else self._engine.in_flight(mine),
            0 if not 0 <= tenant < COUNTERS else self._engine.in_flight(tenant),
        )

    def published(self, client: Client) -> None:
        """The core's own launches in flight (and limits) of ``client`` and its tenant."""
        engine = self._engine
        if 0 <= client.counter < COUNTERS:
            engine.set_external(client.counter, client.launches_in_flight)
            limit = self._launches_per_client
            engine.set_limit(client.counter, -1 if limit is None else limit)
        tenant = client.tenant
        if 0 <= tenant.counter < COUNTERS:
            engine.set_external(tenant.counter, tenant.usage.launches_in_flight)
            quota = tenant.quotas.launches_in_flight
            engine.set_limit(tenant.counter, -1 if quota is None else quota)

    def launched(self) -> int:
        """Launches made without Python: the engine's, and the GPU's own."""
        device = self._device.launched() if self._device is not None else 0
        return int(self._engine.stats()["launches"]) + device

    def _counter_of(self, client: Client) -> int:
        if client.counter < 0:
            client.counter = self._new_counter()
            # Once nothing can count for the client any more, its slot is reused.
            weakref.finalize(client, self._free_counter, client.counter)
        return client.counter

    def _counter_of_tenant(self, tenant: Tenant) -> int:
        if tenant.counter < 0:
            tenant.counter = self._new_counter()
        return tenant.counter

    def _new_counter(self) -> int:
        try:
            return self._free_counters.pop()
        except IndexError:
            counter = next(self._counters)
            return counter if counter < COUNTERS else NO_COUNTER

    def _free_counter(self, counter: int) -> None:
        if counter != NO_COUNTER:
            self._engine.reset_counter(counter)
            self._free_counters.append(counter)

    def _watch(self, state: DeviceHealth) -> None:
        """The core's device state changed: stop launching where it stopped."""
        self._engine.set_serving(state.serving)
        for device in self._drivers:
            self._engine.set_device_ok(device, device not in state.lost)
        if self._device is not None:
            self._device.watch(state.serving, state.lost)

    # The slow thread ----------------------------------------------------------------------

    def _run(self) -> None:
        next_housekeeping = time.monotonic()
        while not self._stopping:
            try:
                for item in self._engine.take_slow(HOUSEKEEPING_SECONDS):
                    self._slow(*item)
                if self._device is not None:
                    self._device.switch()
                now = time.monotonic()
                if now >= next_housekeeping:
                    next_housekeeping = now + HOUSEKEEPING_SECONDS
                    self._housekeep()
            except Exception:
                log.exception("the engine's slow path failed")

    def _slow(self, kind: int, index: int, seq: int, code: int, token: int) -> None:
        entry = self._rings.get(index)
        if entry is None or entry.ring.abandoned:  # removed meanwhile, or its client left:
            return  # not resumed, so the engine takes no more of it until it lets it go
        ring = entry.ring
        if kind == _native.SLOW_RECORD:
            raw = ring.memory.record(seq)  # what is decided, and a ticket's key, is this copy
            try:
                outcome: Handled | Pending = ring.handle(seq, raw)
            except Exception as failure:  # a bug: the record is refused, the ring goes on
                log.exception("a ring record could not be decided", ring_id=ring.id, seq=seq)
                ring.refuse(seq, LaunchFailed(f"the daemon failed on this record: {failure!r}"))
                outcome = Handled()
            if isinstance(outcome, Pending):
                pending = outcome
                pending.add_done_callback(lambda: self._resume(entry, seq, raw, pending.result()))
            else:
                self._resume(entry, seq, raw, outcome)
        elif kind == _native.SLOW_BROKEN:
            ring.break_off(seq, "its head is not within one ring of its tail")
        elif kind in (_native.SLOW_LAUNCH_FAILED, _native.SLOW_FAULT):
            _, session_id, device = self._sessions.get(token, (ring.client_id, None, 0))
            what = "cuGraphLaunch" if kind == _native.SLOW_LAUNCH_FAILED else "cuEventQuery"
            driver = self._drivers.get(device)
            error: AccyError = (
                LaunchFailed(f"{what} failed with error {code}")
                if driver is None
                else driver.error(code, what)
            )
            if isinstance(error, DeviceFault):
                ring.fault(seq, error, session_id, device)
            else:
                ring.refuse_launch(seq, error, session_id)
            if kind == _native.SLOW_FAULT:
                self._engine.fault_done(index)
            else:
                self._engine.resume(index, seq + 1)

    def _resume(self, entry: _Ring, seq: int, raw: bytes, handled: Handled) -> None:
        """Record ``seq`` is decided: the engine takes the ring again after it. A ticket that
        cannot be made is left out (the record's work is still waited for); the ring is
        resumed whatever happens, or its client would wait for it for ever."""
        streams = []
        tickets: list[_native.Ticket] = []
        try:
            if handled.stream is not None and handled.session_id is not None:
                driver = self._drivers[handled.device]
                token = self._token(entry.ring.client_id, handled.session_id, handled.device)
                stream = driver.stream_handle(handled.stream)
                streams.append((handled.device, stream, token))
                entry.reap.add(handled.session_id)
                if self._observer is not None:
                    self._observer.launched(entry.ring.client_id, handled.session_id, 1)
                fast = handled.fast
                if fast is not None:
                    key = raw[KEY:KEY_END]
                    patch = self._device is None  # a device launcher takes exact tickets
                    ticket, device_too = engine_ticket(driver, fast, key, stream, token, patch)
                    tickets.append(ticket)
                    if self._device is not None and device_too:
                        self._device.ticket(entry.index, key, fast, handled.session_id)
            if handled.clear and self._device is not None:
                self._device.cleared(entry.index)
        except Exception:
            log.exception("a ticket could not be made", ring_id=entry.ring.id, seq=seq)
            tickets = []
        finally:
            with contextlib.suppress(KeyError):  # the ring was removed meanwhile
                self._engine.resume(entry.index, seq + 1, streams, tickets, handled.clear)

    def _token(self, client_id: str, session_id: str, device: int) -> int:
        token = self._tokens.get(session_id)
        if token is not None:
            return token
        if not self._free_tokens and self._next_token >= TOKENS:
            self._prune_tokens()
        with self._lock:
            token = self._tokens.get(session_id)
            if token is None:
                if self._free_tokens:
                    token = self._free_tokens.pop()
                else:
                    token = self._next_token
                    self._next_token += 1
                self._tokens[session_id] = token
                self._sessions[token] = (client_id, session_id, device)
            return token

    def _prune_tokens(self) -> None:
        """Tokens of sessions no longer loaded go back (their counts were taken by the last
        housekeeping; a stale ticket naming one never launches)."""
        gone = [
            (token, session_id)
            for token, (client_id, session_id, _) in list(self._sessions.items())
            if self._core.pipeline_of(client_id, session_id) == UNKNOWN_PIPELINE
        ]
        with self._lock:
            for token, session_id in gone:
                self._sessions.pop(token, None)
                self._tokens.pop(session_id, None)
                self._free_tokens.append(token)

    def _housekeep(self) -> None:
        engine = self._engine
        clients = set()
        for index in engine.touched():
            entry = self._rings.get(index)
            if entry is not None:
                clients.add(entry.ring.client_id)
        device = self._device.launches() if self._device is not None else {}
        clients.update(client_id for client_id, _ in device)
        for client_id in clients:
            self._core.touch(client_id)
        if self._observer is not None:
            for token, count in engine.launched():
                known = self._sessions.get(token)
                if known is not None:
                    self._observer.launched(known[0], known[1], count)
            for (client_id, session_id), count in device.items():
                self._observer.launched(client_id, session_id, count)
        for entry in list(self._rings.values()):
            for session_id in list(entry.reap):
                if not self._core.reap(entry.ring.client_id, session_id):
                    entry.reap.discard(session_id)
