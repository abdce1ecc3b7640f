"""Device-work scheduling below the doors: the device-work threads shared fairly between
clients and tenants (``DeviceWork`` over one ``FairPool``), the launch contract's
``WouldBlock`` handled once (``launched``, ``launch_or_defer``), and a launch's end learned
without a thread (``LaunchEnd``)."""

from accyd.scheduling.device_work import DeviceWork
from accyd.scheduling.ends import LaunchEnd, LaunchWaits
from accyd.scheduling.launch import launch_or_defer, launched
from accyd.scheduling.pool import FairPool, PoolClosed

__all__ = [
    "DeviceWork",
    "FairPool",
    "LaunchEnd",
    "LaunchWaits",
    "PoolClosed",
    "launch_or_defer",
    "launched",
]
