"""Choosing the ring engine: the native one where it is built, else the Python loop."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Literal, Protocol

import structlog

from accyd.backends.base import Backend, BackendKind
from accyd.core.interface import Core
from accyd.ring.engine.device_rings import DeviceLaunch, Served
from accyd.ring.engine.pyloop import (
    FLIGHT_SPIN_SECONDS,
    IDLE_SPIN_SECONDS,
    PythonLoop,
    may_spin,
)
from accyd.ring.observer import RingObserver
from accyd.ring.ring import ServerRing

__all__ = ["ENGINE_ENV", "EngineKind", "RingEngine", "open_engine"]

log = structlog.get_logger("accyd.ring.engine")

ENGINE_ENV = "ACCYD_ENGINE"
"""``native``, ``python`` or ``auto`` (the default): which engine takes the rings."""

EngineKind = Literal["auto", "native", "python"]
CROWD_FACTOR = 2
"""How many times the automatic engine threads serve a crowd's rings."""


class RingEngine(Protocol):
    """Takes the records of every ring added to it and launches them; one per daemon, shared
    by the ring doors (shared rings and rings over a stream). It owns the rings added to it:
    ``remove`` returns once none of its threads holds the ring, which it then closes."""

    kind: str
    threads: int
    """The threads that take the rings while their clients fit on the CPUs left (spinning)."""
    max_threads: int
    """The threads that take them once more clients wait than that (``crowded``)."""

    def start(self) -> None: ...

    def crowded(self, crowded: bool) -> None:
        """Whether more ring clients wait than fit on the CPUs left: each of ``max_threads``
        then serves its own lane of the rings, where ``threads`` serve them all otherwise."""
        ...

    def add(self, ring: ServerRing, *, notify_always: bool = False) -> None: ...

    def watch_served(self, told: Served) -> None:
        """``told`` hears whether the GPU serves a ring, each time that changes (never,
        where the engine has no device launch)."""
        ...

    def remove(self, ring: ServerRing) -> None: ...

    def close_client(self, client_id: str) -> None:
        """Nothing kept per client beyond its rings (the doors remove those)."""
        ...

    def device_replaced(self, device: int, backend: Backend) -> None: ...

    def stats(self) -> dict[str, Any]: ...

    def settled(self) -> bool:
        """Whether every ring it holds has finished or refused each record published on it
        (``ServerRing.settled``): a drain waits for this before it detaches the clients."""
        ...

    def close(self) -> None: ...


def open_engine(
    core: Core,
    *,
    kind: EngineKind | None = None,
    threads: int = 0,
    crowd_threads: int = 0,
    timings: bool = False,
    observer: RingObserver | None = None,
    launches_per_client: int | None = None,
    device_launch: DeviceLaunch = "off",
    whole_device: Callable[[str], bool] | None = None,
) -> RingEngine:
    """The engine for ``core``'s rings (``kind`` ``None``: from ``ACCYD_ENGINE``, else auto).

    ``threads`` 0: on a device, four native threads where this process may use 16 CPUs or
    more, two where it may use ``SPIN_CPUS``, else one (measured on an H200 with 16 CPUs, 8
    clients each waiting for every short launch: 204k/s on one thread, 241-258k on two,
    277-295k on four); on the host backend one.

    ``crowd_threads``: the threads that serve the rings while their clients are a crowd
    (more wait than fit on the CPUs left: ``RingEngine.crowded``); 0: twice the automatic
    ``threads`` where those spin (32 waiting clients on an H100 got 1.14-1.49x the
    launches on eight threads than on four), else ``threads``.

    A native engine that cannot be loaded where ``auto`` asked for it leaves the Python
    loop serving, with one warning; where ``native`` was asked for by name it raises.

    ``device_launch`` (``off``, ``crowd`` or ``always``; the native engine only, the Python
    loop says it is off) lets the GPU launch the ticketed records of the rings whose clients
    ask for it, of tenants ``whole_device`` says have no SM partition (``device_rings``).
    """
    wanted = kind or os.environ.get(ENGINE_ENV, "auto")
    if wanted not in ("auto", "native", "python"):
        raise ValueError(f"{ENGINE_ENV} is native, python or auto, not {wanted!r}")
    host = all(b.kind is not BackendKind.CUDA for b in core.backends.values())
    # A device runs launches without this process: spinning on them finds their ends at
    # once. The host backend runs them on this process's threads, which need the CPU and
    # the GIL: the engine's threads spin neither on launches in flight nor between records
    # (on two CPUs an idle spin of 200 µs made a waited launch 1.5x slower: 370 against
    # 240 µs p50, bench/ring_cost.py --backend host).
    flight_spin = 0.0 if host else FLIGHT_SPIN_SECONDS
    idle_spin = 0.0 if host else IDLE_SPIN_SECONDS
    if threads == 0:
        cpus = len(os.sched_getaffinity(0))
        spins = not host and may_spin()
        threads = 4 if spins and cpus >= 16 else 2 if spins else 1
        if crowd_threads == 0 and spins:
            crowd_threads = CROWD_FACTOR * threads
    if wanted != "python":
        try:
            from accyd.ring.engine.native import NativeEngine
        except ImportError as error:
            if wanted == "native":
                raise
            log.warning(
                "the native ring engine is not built here; the Python ring loop serves",
                error=str(error),
            )
        else:
            return NativeEngine(
                core,
                threads=threads,
                max_threads=max(threads, crowd_threads),
                timings=timings,
                spin_seconds=idle_spin,
                flight_spin_seconds=flight_spin,
                observer=observer,
                launches_per_client=launches_per_client,
                device_launch=device_launch,
                whole_device=whole_device,
            )
    if device_launch != "off":
        log.warning("device launch is off: it needs the native ring engine")
    return PythonLoop(
        core, spin_seconds=idle_spin, flight_spin_seconds=flight_spin, observer=observer
    )
