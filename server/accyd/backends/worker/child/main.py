"""A device worker process: one device's backend, served to the front over an inherited channel.

Run as ``python -m accyd.backends.worker.child.main --backend host|cuda --device N --fd FD``
(``accyd.backends.worker.front.spawn`` writes the command). It makes the backend with
``make_backend`` (for CUDA: ``cuInit``, the device, its primary context), sends
``READY``, then runs the front's ops (``accyd.backends.worker.child.ops``) until the channel
closes or ``CLOSE`` comes; then it closes the backend and exits 0.

A ``DeviceFault`` from the backend, or a backend that cannot be made, is sent
as ``FATAL`` and the process exits at once (``EXIT_DEVICE_LOST`` /
``EXIT_NEVER_READY``): a sticky CUDA error cannot be cleared in-process, and
nothing it holds is worth a clean teardown. SIGINT, SIGTERM and SIGHUP are
ignored: the front decides when a worker ends, after its drain. A Ctrl-C, a
service manager's stop (systemd's default kill mode, ``timeout``) and a reload
reach the whole process group; the worker leaves on ``CLOSE``, or when its
channel closes because the front is gone.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

import structlog

from accyd.backends.queues import set_work_queues
from accyd.backends.select import make_backend
from accyd.backends.worker.child.ops import Served
from accyd.backends.worker.protocol import (
    HEARTBEAT_SECONDS,
    FrameReader,
    Op,
    encode_error,
    send_frame,
)
from accyd.errors import DeviceFault
from accyd.logs import configure_logging
from accyd.process.exits import EXIT_DEVICE_LOST, EXIT_NEVER_READY

__all__ = ["IGNORED_SIGNALS", "main"]

IGNORED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""What reaches a worker as one of the daemon's process group, and is the front's to act on."""

log = structlog.get_logger("accyd.backends.worker")


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="accyd.backends.worker.child.main", description=__doc__)
    parser.add_argument("--backend", choices=["cuda", "host"], required=True)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--fd", type=int, required=True, help="the inherited channel")
    parser.add_argument("--lane", type=int, default=None, help="where descriptors go")
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--host-memory-limit", type=int, default=None)
    parser.add_argument("--log-format", choices=["console", "json"], default="console")
    parser.add_argument("--log-level", default="info")
    return parser.parse_args(argv)


def _log_as_device(device: int, log_format: str, level: str) -> None:
    """The daemon's logging (``accyd.logs``), every line naming this worker's device."""
    configure_logging(log_format, level)

    def add_device(logger: object, method: str, event: Any) -> Any:
        event.setdefault("device", device)
        event.setdefault("worker_pid", os.getpid())
        return event

    processors = structlog.get_config()["processors"]
    structlog.configure(processors=[add_device, *processors])


class _Channel:
    """The worker's end: one lock over every frame it sends, from any thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._lock = threading.Lock()

    def send(self, frame: Any) -> None:
        with self._lock:
            send_frame(self.sock, frame)

    def beat(self) -> None:
        """Say the worker runs every ``HEARTBEAT_SECONDS``, until the channel closes (a thread
        of its own: the front declares a silent worker lost, whatever its ops are doing)."""
        while True:
            time.sleep(HEARTBEAT_SECONDS)
            try:
                self.send((Op.ALIVE,))
            except OSError:
                return

    def fatal(self, error: BaseException, status: int = EXIT_DEVICE_LOST) -> NoReturn:
        """Tell the front why, then end the process now (no teardown: the device is lost)."""
        log.error("device worker exiting", reason=str(error), error=type(error).__name__)
        with contextlib.suppress(OSError):
            self.send((Op.FATAL, encode_error(error)))
        os._exit(status)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    for signum in IGNORED_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    _log_as_device(args.device, args.log_format, args.log_level)
    started = time.perf_counter()
    channel = _Channel(socket.socket(fileno=args.fd))
    set_work_queues()  # the daemon's value, inherited; else the default (before any context)
    try:
        backend = make_backend(
            args.backend,
            device=args.device,
            cache_dir=args.cache_dir,
            host_memory_limit=args.host_memory_limit,
        )
    except BaseException as error:
        lost = isinstance(error, DeviceFault)
        channel.fatal(error, EXIT_DEVICE_LOST if lost else EXIT_NEVER_READY)
    lane = None if args.lane is None else socket.socket(fileno=args.lane)
    served = Served(backend, channel.send, channel.fatal, lane)
    channel.send(
        (
            Op.READY,
            {
                "kind": backend.kind.value,
                "formats": sorted(f.value for f in backend.formats),
                "device_name": backend.device_name,
                "pid": os.getpid(),
            },
        )
    )
    threading.Thread(target=channel.beat, name="accyd-worker-heartbeat", daemon=True).start()
    log.info(
        "device worker ready",
        backend=backend.kind.value,
        device_name=backend.device_name,
        backend_ms=round((time.perf_counter() - started) * 1000, 1),  # imports not counted
    )
    why = "its channel closed"
    reader = FrameReader(channel.sock)
    while True:
        try:
            frame = reader.recv()
        except (EOFError, OSError):
            break
        try:
            if not served.run(frame):
                why = "asked to close"
                break
        except Exception:  # a bug here must not take the device's other work down
            log.exception("device worker op failed")
    log.info("device worker closing", reason=why)
    served.close()
    channel.sock.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
