"""The ring doors of one server: the engine every ring shares, the ring over a stream, and the
shared ring door once a Unix socket listens (made, started and closed here, in that order)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from accyd.core.interface import Core
from accyd.doors.hostmem import Segments
from accyd.ring.charges import RingCharges
from accyd.ring.door import RingDoor
from accyd.ring.engine.auto import EngineKind, RingEngine, open_engine
from accyd.ring.engine.device_rings import DeviceLaunch
from accyd.ring.observer import RingObserver
from accyd.ring.stream import StreamRings
from accyd.ring.waiting import WaitBudget
from accyd.scheduling import DeviceWork

__all__ = ["RingDoors"]

SETTLE_POLL_SECONDS = 0.005


class RingDoors:
    """Owns the engine and the shared ring door (the streams' rings end with their calls).

    A ring's launch that allocates scratch of its own runs on the device-work threads
    within its client's share, as a gRPC call's would, never on the engine (``work``).
    """

    def __init__(
        self,
        daemon: Core,
        work: DeviceWork,
        *,
        kind: EngineKind | None,
        threads: int,
        crowd_threads: int = 0,
        spin_seconds: float,
        observer: RingObserver,
        wait_budget: bool = True,
        engine_timings: bool = False,
        device_launch: DeviceLaunch = "off",
    ) -> None:
        self._daemon = daemon
        self._observer = observer
        self._work = work
        self.engine: RingEngine = open_engine(
            daemon,
            kind=kind,
            threads=threads,
            crowd_threads=crowd_threads,
            timings=engine_timings,
            observer=observer,
            launches_per_client=daemon.launches_per_client,
            device_launch=device_launch,
            whole_device=getattr(daemon, "whole_device", None),
        )
        self.streams = StreamRings(
            daemon,
            self.engine,
            work=work,
            spin_seconds=spin_seconds,
            observer=observer,
        )
        self.door: RingDoor | None = None
        # The engine's threads, the thread that decides slow records and the event loop
        # (which polls a while after each call) keep their CPUs.
        self.waits = WaitBudget(
            self.engine.threads + 2,
            enabled=wait_budget,
            on_crowded=self.engine.crowded,
        )
        self.engine.watch_served(self.waits.set_device)

    def open_door(self, socket_path: Path) -> tuple[RingDoor, Segments]:
        """The shared ring door beside ``socket_path`` (its mode: who may call may take a
        ring), and the memory segments handed over its handoff socket, which its rings' COPY
        records copy through; a detached client's rings close first, before its other
        extensions (the server adds the segments next)."""
        door = self.door = RingDoor(
            self._daemon,
            socket_path,
            self.engine,
            work=self._work,
            observer=self._observer,
            waits=self.waits,
        )
        door.charges = RingCharges(self._daemon)
        segments = door.copier.copies = Segments(self._daemon, door.handoff)
        self._daemon.extend(door)
        return door, segments

    def start(self) -> None:
        """Start the door and the engine (after the extensions are in place)."""
        if self.door is not None:
            self.door.start()
        self._daemon.extend(self.engine)
        self.engine.start()

    async def wait_settled(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every ring to finish or refuse each record
        published on it (while draining, the engine refuses new ones); True if they did.
        The device going idle is not enough: a launch's end reaches its ring a moment after."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.engine.settled():
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(SETTLE_POLL_SECONDS)
        return True

    async def close(self) -> None:
        """Close the door's rings, then the engine; idempotent."""
        if self.door is not None:
            await asyncio.to_thread(self.door.close)
        await asyncio.to_thread(self.engine.close)
