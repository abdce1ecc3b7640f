"""How the rings' clients wait: the spin budget the daemon publishes in each ring's header.

A client waiting on ``done`` spins a while before it sleeps on the ``complete`` eventfd:
waking a sleeper costs tens of microseconds, a spin one core. With more waiting clients
than cores, spinners take the CPUs the engine's threads need to launch and complete the
very work they wait for (32 clients spinning up to 1 ms on 16 CPUs left the engine 2.6
CPU-seconds of a 3 s window instead of 11; the same clients never spinning ran 1.8-2.7x
faster at a 20-30th of the p99). So the daemon, which knows how many rings are attached and
how many CPUs it may run on, tells each client how long it may spin (``spin_budget``):
all may spin while they fit on the CPUs the engine leaves over, none once they do not.
The budget is the same for every client (spinning is a latency edge: one client's is
another's), and a client takes the lesser of it and its own default
(``accy._ring.Ring.wait_spin``). Told instead to spin giving the CPU away every turn
(``sched_yield``, CUDA's yield policy), 32 clients on an H100 with 16 CPUs got 0.88x the
launches and a p99 of 1.9 ms, the slowest client 0.56 of the mean: the scheduler shares a
CPU between yielders, not with the engine thread beside them. Once the clients are a
crowd the engine also serves their rings on more threads (``on_crowded``).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable

import structlog

from accy.protocol import ring as layout
from accyd.ring.memory import RingMemory

__all__ = ["DEVICE_SPIN_US", "FULL_SPIN_US", "SHORT_SPIN_US", "WaitBudget", "crowd", "spin_budget"]

log = structlog.get_logger("accyd.ring")

FULL_SPIN_US = 1000
"""The spin where CPUs are plenty (8 or more), as a client's own default."""
SHORT_SPIN_US = 100
"""The spin on fewer CPUs."""
PLENTY_CPUS = 8
DEVICE_SPIN_US = 2000
"""The spin of a ring the GPU serves (``SPIN_DEVICE``), whatever the crowd: no engine thread
needs the CPUs on its launches' path, and its client yields the CPU at every turn."""


def spin_budget(waiters: int, cpus: int, reserved: int) -> int:
    """Microseconds each of ``waiters`` waiting clients may spin, sharing ``cpus`` CPUs with
    ``reserved`` busy daemon threads (the engine's, the one that decides slow records, the
    event loop):
    the full spin while the spinners fit on what is left (at least one CPU), else 0 (sleep
    on the eventfd at once)."""
    if crowd(waiters, cpus, reserved):
        return 0
    return FULL_SPIN_US if cpus >= PLENTY_CPUS else SHORT_SPIN_US


def crowd(waiters: int, cpus: int, reserved: int) -> bool:
    """Whether ``waiters`` spinning clients would not fit on the CPUs ``reserved`` threads
    leave (at least one)."""
    return waiters > max(cpus - reserved, 1)


class WaitBudget:
    """Publishes ``spin_budget`` into every attached ring's header, anew whenever a ring is
    attached or let go. ``enabled=False`` publishes nothing (each client spins as its own
    CPU count says: ``--wait-budget off``)."""

    def __init__(
        self,
        reserved: int,
        *,
        cpus: int | None = None,
        enabled: bool = True,
        on_crowded: Callable[[bool], None] | None = None,
    ) -> None:
        self.cpus = len(os.sched_getaffinity(0)) if cpus is None else cpus
        self.reserved = reserved
        self.enabled = enabled
        self.on_crowded = on_crowded
        """Told (under the budget's lock) each time the crowd forms or goes: the engine then
        serves the rings on more threads, or on fewer again."""
        self.crowded = False
        self._rings: set[RingMemory] = set()
        self._device: set[RingMemory] = set()
        """The rings the GPU serves: told ``SPIN_DEVICE`` even when the budget is off."""
        self._lock = threading.Lock()
        self.budget_us = spin_budget(0, self.cpus, reserved)

    @property
    def waiters(self) -> int:
        return len(self._rings)

    def attach(self, memory: RingMemory, *, device: bool = False) -> None:
        """A ring's client may wait from now on (``device``: the GPU serves the ring)."""
        with self._lock:
            self._rings.add(memory)
            if device:
                self._device.add(memory)
            self._publish()

    def set_device(self, memory: RingMemory, served: bool) -> None:
        """Whether the GPU serves the ring now (its client is told, once it is attached)."""
        with self._lock:
            if served:
                self._device.add(memory)
            else:
                self._device.discard(memory)
            if memory in self._rings:
                self._publish()

    def detach(self, memory: RingMemory) -> None:
        """A ring let go (idempotent)."""
        with self._lock:
            if memory not in self._rings:
                return
            self._rings.discard(memory)
            self._device.discard(memory)
            self._publish()

    def _publish(self) -> None:
        # Switched off, the clients spin whatever their number: more engine threads would
        # only take more of their CPUs.
        crowded = self.enabled and crowd(len(self._rings), self.cpus, self.reserved)
        if crowded != self.crowded:
            self.crowded = crowded
            if self.on_crowded is not None:
                self.on_crowded(crowded)
        budget = spin_budget(len(self._rings), self.cpus, self.reserved)
        changed = budget != self.budget_us
        self.budget_us = budget
        device = layout.SPIN_SET | layout.SPIN_DEVICE | DEVICE_SPIN_US
        if changed and self.enabled:
            log.debug("ring clients' spin", waiters=len(self._rings), cpus=self.cpus, us=budget)
        for memory in self._rings:  # a new ring needs it even when the budget stays
            if memory not in self._device and not self.enabled:
                continue
            with contextlib.suppress(ValueError):  # closed meanwhile: nobody reads it
                served = memory in self._device
                memory.set_u32(layout.WAIT_SPIN, device if served else layout.SPIN_SET | budget)
