"""The device launcher: rings served by a resident kernel that launches checked graphs itself.

The device-side scheduler built into accy (``docs/device-launch.md``): the launcher and its
host side. The ring engine hands it the rings it serves (``ring/engine/device_serving.py``);
what it does with a record is in ``launcher_source``.

Ownership, all on the one CUDA device whose backend made it:

- The module (NVRTC, relocatable, linked with ``libcudadevrt.a`` by the driver's linker),
  the tables (``launcher_tables``: device memory, the mapped control page, the stream the
  host's writes go on) and ``LAUNCHERS`` instance graphs, each on a non-blocking stream of
  its own: made here, freed by ``close()`` (idempotent, with a ``weakref.finalize`` net)
  once every instance stopped.
- A ring's memory is registered (``cuMemHostRegister``, mapped) by ``attach`` and
  unregistered by ``detach``, which first makes sure no launcher looks at it and no graph
  it launched still runs (``drain``).
- A ``DeviceGraph`` (its instances, made by ``graph``) belongs to its caller, who closes it
  after dropping every ticket naming it.
- One host thread relaunches an instance whose run ended (each run makes at most
  ``PER_RUN`` launches, or looks ``ROUNDS`` times).
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import struct
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from accy.protocol import ring as layout
from accyd.backends.base import Stream
from accyd.backends.cuda import launcher_source as lay
from accyd.backends.cuda.compile_cache import CompileCache
from accyd.backends.cuda.devrt import find_devrt, link_devrt
from accyd.backends.cuda.driver import ErrorCheck
from accyd.backends.cuda.graphs import DeviceGraph
from accyd.backends.cuda.launcher_tables import LauncherTables
from accyd.errors import LaunchFailed, RuntimeUnavailable

__all__ = ["DeviceLauncher", "RingState"]

log = structlog.get_logger("accyd.device_launcher")

PER_RUN = 112
"""Launches per instance run: a graph may make at most 120 fire-and-forget launches."""
ROUNDS = 4096
"""Looks per instance run: an idle instance ends after a few milliseconds (a device-wide
synchronize waits for it), and the relauncher starts it again."""
RELAUNCH_POLL_SECONDS = 20e-6
ACK_TIMEOUT_SECONDS = 5.0
_RING_HEAD = struct.Struct(lay.RING_FIELDS)
_STATS = struct.Struct(lay.STATS_FIELDS)
_LIVE_NEXT = struct.Struct("<II")
"""A ticket's ``live`` and ``next`` words, right after its key."""
_TICKET_HEAD = struct.Struct(f"<{lay.KEY_BYTES}sIIQQ{lay.INSTANCES}Q")


class _Device(Protocol):
    """What the launcher needs of ``CudaBackend``."""

    _cu: Any
    _check: ErrorCheck
    cache: CompileCache
    compute_capability: tuple[int, int]

    def _enter(self) -> None: ...

    def create_stream(self, partition: str | None = None, priority: int = 0) -> Stream: ...

    def destroy_stream(self, stream: Stream) -> None: ...


@dataclass(frozen=True, slots=True)
class RingState:
    """What the launcher did with one ring: ``claimed`` (records before it taken),
    ``left`` (``seq + 1`` of the last record left to the CPU path; 0: none) and launches."""

    claimed: int
    left: int
    launched: int


class DeviceLauncher:
    """The launcher of one CUDA device (see the module's docstring for who owns what)."""

    def __init__(self, device: _Device, *, per_run: int = PER_RUN, rounds: int = ROUNDS) -> None:
        if not 1 <= per_run <= 120:
            raise ValueError(f"per_run is 1..120, not {per_run}")
        self._device = device
        self._cu = device._cu
        self._check = device._check
        device._enter()
        self._lock = threading.Lock()
        self._rings: dict[int, tuple[mmap.mmap, Any]] = {}
        """slot -> (the ring's map, its registration's anchor)."""
        self._epochs_free = list(range(lay.EPOCHS - 1, -1, -1))
        self._relaunches = 0
        self._stopping = False
        self.failure: str | None = None
        """Why the launcher stopped serving (an instance failed), once it did."""
        self._owned: list[Callable[[], object]] = []
        try:
            self._build(per_run, rounds)
        except BaseException:
            self._free()
            raise
        self._finalizer = weakref.finalize(self, DeviceLauncher._free_all, self._owned)
        self._thread = threading.Thread(
            target=self._relaunch, name="accyd-device-launcher", daemon=True
        )
        self._thread.start()

    # -- making it -----------------------------------------------------------------

    def _build(self, per_run: int, rounds: int) -> None:
        cu, check, owned = self._cu, self._check, self._owned
        image = self._device.cache.compile(
            lay.source(),
            arch=self._device.compute_capability,
            name="accy_launcher.cu",
            options=["-rdc=true"],
        )
        linked = link_devrt(cu, check, image.data, image.kind, find_devrt())
        module = check(cu.cuModuleLoadData(linked), "cuModuleLoadData(launcher)")
        owned.append(functools.partial(cu.cuModuleUnload, module))
        launcher = check(cu.cuModuleGetFunction(module, b"accy_launcher"), "accy_launcher")
        self._done_fn = check(cu.cuModuleGetFunction(module, b"accy_done"), "accy_done")
        tables = self._tables = LauncherTables(cu, check, self._device._enter, owned)
        self._instances: list[tuple[Any, Any]] = []
        types = (*(ctypes.c_void_p,) * 3, ctypes.c_int, ctypes.c_int, ctypes.c_int)
        non_blocking = cu.CUstream_flags.CU_STREAM_NON_BLOCKING
        for k in range(lay.LAUNCHERS):
            stream = check(cu.cuStreamCreate(non_blocking), "cuStreamCreate")
            owned.append(functools.partial(cu.cuStreamDestroy, stream))
            args = (tables.rings, tables.stats, tables.control, k, per_run, rounds)
            run = functools.partial(
                self._launch, launcher, lay.MAX_RINGS, args, types, "accy_launcher"
            )
            graph_exec = self._captured(stream, run, 0)
            owned.append(functools.partial(cu.cuGraphExecDestroy, graph_exec))
            check(cu.cuGraphUpload(graph_exec, stream), "cuGraphUpload(launcher)")
            self._instances.append((stream, graph_exec))
        for stream, graph_exec in self._instances:
            check(cu.cuGraphLaunch(graph_exec, stream), "cuGraphLaunch(launcher)")

    def _launch(
        self,
        function: Any,
        threads: int,
        args: tuple[Any, ...],
        types: tuple[Any, ...],
        what: str,
        stream: Any,
    ) -> None:
        """``function`` on one block of ``threads`` on ``stream``."""
        self._check(
            self._cu.cuLaunchKernel(function, 1, 1, 1, threads, 1, 1, 0, stream, (args, types), 0),
            what,
            LaunchFailed,
        )

    def _captured(self, stream: Any, enqueue: Callable[[Any], None], flags: int) -> Any:
        """A graph of what ``enqueue`` puts on ``stream``, captured and instantiated."""
        cu, check = self._cu, self._check
        mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check(cu.cuStreamBeginCapture(stream, mode), "cuStreamBeginCapture", LaunchFailed)
        graph: Any = None
        try:
            try:
                enqueue(stream)
            finally:
                graph = check(cu.cuStreamEndCapture(stream), "cuStreamEndCapture", LaunchFailed)
            return check(cu.cuGraphInstantiate(graph, flags), "cuGraphInstantiate", LaunchFailed)
        finally:
            if graph is not None:
                cu.cuGraphDestroy(graph)

    # -- rings -----------------------------------------------------------------------

    def attach(self, memory: mmap.mmap, slot_count: int) -> int:
        """Register a ring's memory (mapped into the GPU) and let the launcher watch it; the
        ring's slot in the table. The map stays exported (it cannot be closed) until
        ``detach``."""
        cu, check = self._cu, self._check
        self._device._enter()
        with self._lock:
            slot = next((k for k in range(lay.MAX_RINGS) if k not in self._rings), None)
            if slot is None:
                raise RuntimeUnavailable(f"the device launcher serves {lay.MAX_RINGS} rings")
            anchor = (ctypes.c_char * len(memory)).from_buffer(memory)
            address = ctypes.addressof(anchor)
            flags = cu.CU_MEMHOSTREGISTER_DEVICEMAP | cu.CU_MEMHOSTREGISTER_PORTABLE
            check(cu.cuMemHostRegister(address, len(memory), flags), "cuMemHostRegister")
            try:
                mapped = int(check(cu.cuMemHostGetDevicePointer(address, 0), "device pointer"))
                entry = self._tables.ring(slot)
                done = _done(memory)
                head = _RING_HEAD.pack(mapped, slot_count, 0, done, 0, 0)
                self._tables.write(entry, head.ljust(lay.RING_BYTES, b"\0"))  # no ticket live
                self._tables.put_u32(entry + lay.RING_LIVE_OFFSET, 1)  # live, once all is there
            except BaseException:
                cu.cuMemHostUnregister(address)
                raise
            self._rings[slot] = (memory, anchor)
            return slot

    def detach(self, slot: int, timeout: float = ACK_TIMEOUT_SECONDS) -> None:
        """Stop watching ring ``slot``, wait until none of the graphs it launched still runs,
        and unregister its memory (its map may be closed after)."""
        self._device._enter()
        self._tables.put_u32(self._tables.ring(slot) + lay.RING_LIVE_OFFSET, 0)
        self._barrier(timeout)
        self.drain()
        with self._lock:
            _, anchor = self._rings.pop(slot)
        self._check(self._cu.cuMemHostUnregister(ctypes.addressof(anchor)), "cuMemHostUnregister")

    def drain(self) -> None:
        """Return once no graph launched so far still runs: every instance's run is ended
        (``stop``) and its stream waited for, since a run is over only once the graphs it
        launched are. Not ``done`` words: a client may write its own ring's. The instances
        start again at the relauncher's next look."""
        cu, check = self._cu, self._check
        self._device._enter()
        with self._lock:  # the relauncher starts no instance meanwhile
            self._tables.set_signal(stop=1)
            try:
                for stream, _ in self._instances:
                    check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize(launcher)")
            finally:
                self._tables.set_signal(stop=1 if self._stopping else 0)

    def ring_state(self, slot: int) -> RingState:
        _, _, _, claimed, left, launched = _RING_HEAD.unpack(
            self._tables.read(self._tables.ring(slot), _RING_HEAD.size)
        )
        return RingState(claimed, left, launched)

    # -- graphs and tickets ----------------------------------------------------------------

    def graph(self, slot: int, enqueue: Callable[[Stream], None]) -> DeviceGraph:
        """A device graph of what ``enqueue`` puts on the stream it is given (a stream of the
        whole device; kernel, memcpy and memset work only), then ``accy_done`` for ring
        ``slot``: ``INSTANCES`` instances, uploaded. Raises ``LaunchFailed`` where the work
        cannot be launched from the device."""
        cu, check = self._cu, self._check
        self._device._enter()
        stream = self._device.create_stream(None)
        flags = int(cu.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH)
        ring = self._tables.ring(slot)

        def with_done(s: Any) -> None:
            enqueue(stream)
            args, types = (ring, self._tables.stats), (ctypes.c_void_p, ctypes.c_void_p)
            self._launch(self._done_fn, 1, args, types, "accy_done", s)

        execs: list[Any] = []
        try:
            for _ in range(lay.INSTANCES):
                execs.append(self._captured(stream.native, with_done, flags))
                check(cu.cuGraphUpload(execs[-1], stream.native), "cuGraphUpload", LaunchFailed)
            check(cu.cuStreamSynchronize(stream.native), "cuStreamSynchronize")
        except BaseException:
            DeviceGraph(cu, execs).close()
            raise
        finally:
            self._device.destroy_stream(stream)
        return DeviceGraph(cu, execs)

    def put_ticket(
        self,
        slot: int,
        key: bytes,
        graph: DeviceGraph,
        epoch: int,
        value: int,
        index: int | None = None,
    ) -> int:
        """Let records of ring ``slot`` whose launch bytes are ``key`` launch ``graph`` while
        ``epoch`` holds ``value`` (the value the launch was checked against); the ticket's
        index (``index``: that place, whose ticket is stale or dropped; else the first free)."""
        if len(key) != lay.KEY_BYTES:
            raise ValueError(f"a ticket's key is {lay.KEY_BYTES} bytes, not {len(key)}")
        self._device._enter()
        with self._lock:
            if index is None:
                taken = self._tickets_live(slot)
                index = next((t for t in range(lay.TICKETS) if t not in taken), None)
            if index is None:
                raise RuntimeUnavailable(f"ring {slot} holds {lay.TICKETS} device tickets")
            entry = self._tables.ticket(slot, index)
            packed = _TICKET_HEAD.pack(key, 0, 0, self._tables.epoch(epoch), value, *graph.handles)
            self._tables.write(entry, packed)
            self._tables.put_u32(entry + lay.KEY_BYTES, 1)  # live, once the rest is in place
            return index

    def drop_ticket(
        self, slot: int, index: int, timeout: float = ACK_TIMEOUT_SECONDS, *, barrier: bool = True
    ) -> None:
        """No record launches ticket ``index`` of ring ``slot`` once this returns (its graph
        may still run: ``drain`` waits for that); ``barrier=False`` for a ticket already stale
        (its epoch was revoked), which only frees its place."""
        self._device._enter()
        self._tables.put_u32(self._tables.ticket(slot, index) + lay.KEY_BYTES, 0)
        if barrier:
            self._barrier(timeout)

    def ticket_launches(self, slot: int) -> list[int]:
        """How many launches each of ring ``slot``'s ticket places made since it was put
        (its ``next`` word; a launch the device refused is counted too, and left)."""
        return [launches for _, launches in self._ticket_words(slot)]

    def _tickets_live(self, slot: int) -> set[int]:
        return {t for t, (live, _) in enumerate(self._ticket_words(slot)) if live}

    def _ticket_words(self, slot: int) -> list[tuple[int, int]]:
        """Each of ring ``slot``'s ticket places' ``live`` and ``next`` words."""
        raw = self._tables.read(self._tables.ring(slot), lay.RING_BYTES)
        at = lay.TICKET_OFFSET + lay.KEY_BYTES
        return [_LIVE_NEXT.unpack_from(raw, at + t * lay.TICKET_BYTES) for t in range(lay.TICKETS)]

    # -- epochs ------------------------------------------------------------------------------

    def new_epoch(self) -> int:
        with self._lock:
            if not self._epochs_free:
                raise RuntimeUnavailable(f"the device launcher has {lay.EPOCHS} epochs")
            return self._epochs_free.pop()

    def epoch_value(self, epoch: int) -> int:
        return self._tables.epoch_value(epoch)

    def revoke(self, epochs: list[int], timeout: float = ACK_TIMEOUT_SECONDS) -> None:
        """Make every ticket checked against ``epochs`` stale; returns once no launch
        checked against their old values can still be made."""
        for epoch in epochs:
            self._tables.bump_epoch(epoch)
        self._barrier(timeout)

    def free_epoch(self, epoch: int) -> None:
        self.revoke([epoch])
        with self._lock:
            self._epochs_free.append(epoch)

    def _barrier(self, timeout: float) -> None:
        """Bump the generation and wait until every running instance began a round after
        it (an instance whose stream is idle looks at nothing)."""
        cu = self._cu
        self._device._enter()
        with self._lock:  # the relauncher starts no instance meanwhile
            generation = (self._tables.generation + 1) & 0xFFFFFFFF
            self._tables.set_signal(generation=generation)
            deadline = time.monotonic() + timeout
            for k, (stream, _) in enumerate(self._instances):
                while True:
                    acked = self._tables.ack(k)
                    if (acked - generation) & 0x80000000 == 0:
                        break
                    if int(cu.cuStreamQuery(stream)[0]) == 0:  # not running
                        break
                    if time.monotonic() > deadline:
                        raise LaunchFailed(f"device launcher {k} did not answer in {timeout:g} s")
                    time.sleep(10e-6)

    # -- running -----------------------------------------------------------------------------

    def _relaunch(self) -> None:
        cu = self._cu
        not_ready = int(cu.CUresult.CUDA_ERROR_NOT_READY)
        try:
            self._device._enter()
            while not self._stopping:
                with self._lock:
                    for k, (stream, graph_exec) in enumerate(self._instances):
                        status = int(cu.cuStreamQuery(stream)[0])
                        if status == not_ready:
                            continue
                        if status != 0:
                            raise self._check.error(cu.CUresult(status), f"launcher {k}")
                        self._check(cu.cuGraphLaunch(graph_exec, stream), "cuGraphLaunch")
                        self._relaunches += 1
                time.sleep(RELAUNCH_POLL_SECONDS)
        except Exception as error:  # the launcher can no longer serve: say why once
            self.failure = str(error)
            log.error("the device launcher stopped", error=self.failure)

    def stats(self) -> dict[str, int]:
        """Its counters since it started. Means, in nanoseconds: ``round_ns``, an instance's
        look at every ring; per launch made, ``look_ns`` from the look's start to the launch
        call, ``launch_ns`` in it, and ``graph_ns`` from its return to the graph's end."""
        raw = self._tables.read(self._tables.stats, _STATS.size)
        launched, errors, runs, left, rounds, round_ns, look, call, graph, last_error = (
            _STATS.unpack(raw)
        )
        made = max(launched, 1)
        return {
            "launched": launched,
            "errors": errors,
            "runs": runs,
            "left": left,
            "last_error": last_error,
            "round_ns": round_ns // max(rounds, 1),
            "look_ns": look // made,
            "launch_ns": call // made,
            "graph_ns": graph // made,
            "relaunches": self._relaunches,
            "rings": len(self._rings),
        }

    def close(self) -> None:
        """Stop every instance, then free what the launcher made (rings still attached are
        unregistered). Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        self._thread.join()
        self._device._enter()
        with self._lock:
            self._tables.set_signal(stop=1)
        for stream, _ in self._instances:  # the runs, and every graph they launched, end
            self._cu.cuStreamSynchronize(stream)
        for slot in list(self._rings):
            _, anchor = self._rings.pop(slot)
            self._cu.cuMemHostUnregister(ctypes.addressof(anchor))
        self._finalizer()

    def _free(self) -> None:
        DeviceLauncher._free_all(self._owned)

    @staticmethod
    def _free_all(owned: list[Callable[[], object]]) -> None:
        while owned:
            owned.pop()()


def _done(memory: mmap.mmap) -> int:
    """A ring's ``done`` word, as its client reads it."""
    return int(struct.unpack_from("<Q", memory, layout.DONE)[0])
