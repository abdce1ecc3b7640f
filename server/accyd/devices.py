"""The daemon's devices: the backends that serve them, and one device's replacement after a fault.

Without device workers each device's backend lives in the daemon's process;
with them (``--device-workers``) each runs in a worker process of a
``DevicePool``, and a fault on one device is isolated: its warm spare takes
over while the other devices and their clients see nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import structlog

from accyd.backends.base import Backend
from accyd.backends.queues import set_work_queues
from accyd.backends.select import make_backend
from accyd.backends.worker.front.pool import DevicePool
from accyd.core.daemon import Daemon
from accyd.errors import DeviceFault
from accyd.settings.config import Config
from accyd.telemetry.metrics import Metrics

__all__ = ["open_backends", "replace_device"]

log = structlog.get_logger("accyd.server")


def open_backends(
    config: Config, on_worker_fault: Callable[[int, DeviceFault], None]
) -> tuple[Mapping[int, Backend], DevicePool | None]:
    """Each device's backend, and the pool that owns them when each runs in a worker
    process (``on_worker_fault`` hears of a worker lost while idle). The caller closes
    them: the pool when there is one, else each backend. The CUDA contexts' work queues are
    set first (``accyd.backends.queues``), for this process and the workers it starts."""
    set_work_queues(config.cuda_max_connections)  # the "accyd serving" line shows it
    if config.uses_device_workers:
        pool = DevicePool(
            config.backend,
            sorted(set(config.devices)),
            cache_dir=config.cache_dir,
            host_memory_limit=config.host_memory_limit,
            on_fault=on_worker_fault,
            log_format=config.log_format,
            log_level=config.log_level,
            gpus=dict(config.device_gpus),
            hang_seconds=config.worker_hang_seconds,
        )
        return pool.backends, pool
    backends = {
        device: make_backend(
            config.backend,
            device=device,
            cache_dir=config.cache_dir,
            host_memory_limit=config.host_memory_limit,
        )
        for device in config.devices
    }
    return backends, None


def replace_device(
    pool: DevicePool | None, daemon: Daemon, metrics: Metrics, fault: DeviceFault
) -> None:
    """*Blocking*: after a fault on one isolated device, its warm spare serves it (the
    daemon drops what its clients held there, and its extensions hear of it: open
    segments are pinned again for the new worker) and the faulted worker process ends."""
    device = fault.device
    if device is None or pool is None:
        return
    metrics.device_faults.inc()
    started = time.monotonic()
    try:
        backend = pool.replace(device)
    except Exception as error:  # the device stays lost; its calls say so
        log.error("device replacement failed", device=device, error=str(error))
        return
    daemon.replace_device(device, backend)
    log.info(
        "device serving again",
        device=device,
        session_id=fault.session,
        seconds=round(time.monotonic() - started, 4),
    )
