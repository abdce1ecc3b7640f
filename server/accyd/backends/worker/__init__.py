"""Device workers: each device's backend in a child process, so a sticky fault kills one worker.

``WorkerBackend`` (``proxy``) is the ``Backend`` protocol over a channel to one
worker (``worker``, ``served``); ``DevicePool`` (``pool``) keeps, per device, the
active worker and a warm spare that replaces it after a fault. The wire
protocol is written down in one place: ``protocol``. Imports are lazy, so the
worker process (``python -m accyd.backends.worker.child.main``) loads none of the front's modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accyd.backends.worker.front.pool import DevicePool
    from accyd.backends.worker.front.proxy import WorkerBackend

__all__ = ["DevicePool", "WorkerBackend"]


def __getattr__(name: str) -> Any:
    if name == "DevicePool":
        from accyd.backends.worker.front.pool import DevicePool

        return DevicePool
    if name == "WorkerBackend":
        from accyd.backends.worker.front.proxy import WorkerBackend

        return WorkerBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
