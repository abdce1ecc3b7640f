"""Probe the submission ring's cost on a backend: one client process, saxpy at small n.

Measures, in one run: the core's ``launch`` alone (in-process, per call), ring
launches per second from a client process (waiting every 16), the ring's round
trip (launch + wait), and on CUDA the in-process cuda-python launch + synchronize
of the same kernel for reference. Prints a table last; ``--profile`` adds the
core launch's top functions.
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import multiprocessing as mp
import pstats
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

import structlog

from accy._ring import Ring
from accy.protocol import ring as layout
from accyd.backends.select import make_backend
from accyd.catalog import load_catalog
from accyd.catalog.dtypes import DType, Scalar
from accyd.core.daemon import Daemon
from accyd.ring import RingDoor
from accyd.scheduling import DeviceWork

SAXPY = "accy.kernel.saxpy"
N = 1024


def client(path: str, ring_id: str, ticket: bytes, ids: list[str], count: int, q: Any) -> None:
    ring = Ring.connect(Path(path), ring_id, ticket)
    s, x, y = (ring.new_handle() for _ in range(3))
    ring.bind(layout.Kind.BIND_SESSION, s, ids[0], 5)
    ring.bind(layout.Kind.BIND_BUFFER, x, ids[1], 5)
    ring.bind(layout.Kind.BIND_BUFFER, y, ids[2], 5)
    # As the client library writes a repeated launch: its record's fixed part kept, the
    # scalars packed straight into the slot.
    fixed = Ring.fixed_part(s, [x, y], [y], 2)
    packer = struct.Struct("<I4xf4x48x")
    scalars = (N, 1.0)
    out: dict[str, float] = {}
    for _ in range(2):  # warm, then measured
        start = time.perf_counter()
        for i in range(count):
            seq = ring.launch_fixed(fixed, packer, scalars, i % 16 == 15, 10)
            if i % 16 == 15:
                ring.wait(seq - 8, 10)  # keep about a window of 8..24 in flight
        ring.wait(seq, 10)
        out["launches_per_s"] = count / (time.perf_counter() - start)
    times = []
    for _ in range(2000):
        t0 = time.perf_counter()
        seq = ring.launch_fixed(fixed, packer, scalars, True, 10)
        ring.wait(seq, 10)
        times.append(time.perf_counter() - t0)
    times.sort()
    out["rtt_p50_us"] = times[len(times) // 2] * 1e6
    out["rtt_p99_us"] = times[int(len(times) * 0.99)] * 1e6
    out["errors"] = float(len(ring.errors()))
    ring.close()
    q.put(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", default="host")
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    if args.backend == "recording":  # no device: the submitter's own cost
        from accyd.backends.recording import RecordingBackend

        backend: Any = RecordingBackend()
    else:
        backend = make_backend(args.backend)
    daemon = Daemon(load_catalog(), {0: backend})
    folder = Path(tempfile.mkdtemp())
    work = DeviceWork(2)
    door = RingDoor(daemon, folder / "accyd.sock", work=work)
    door.start()
    cid = daemon.attach("probe").id
    sid = daemon.load_pipeline(cid, SAXPY).session_id
    x = daemon.allocate_buffer(cid, 4 * N, DType.F32).id
    y = daemon.allocate_buffer(cid, 4 * N, DType.F32).id
    scalars = {"n": Scalar.u32(N), "a": Scalar.f32(1.0)}
    rows: list[tuple[str, float]] = []
    # The core's launch alone, on this thread.
    profile = cProfile.Profile() if args.profile else None
    for rep in range(2):
        start = time.perf_counter()
        if profile and rep:
            profile.enable()
        for i in range(args.count):
            ticket = daemon.launch(cid, sid, [x, y], [y], scalars, watch=i % 16 == 15)
            if ticket.watch is not None:
                ticket.watch.close()
            if i % 256 == 255:
                daemon.wait_launch(cid, sid)
        daemon.wait_launch(cid, sid)
        if profile and rep:
            profile.disable()
        per = (time.perf_counter() - start) / args.count * 1e6
    rows.append(("core.launch per call, us", per))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    offer = door.offer(cid, 1024)
    proc = ctx.Process(
        target=client,
        args=(str(door.path), offer.ring_id, offer.ticket, [sid, x, y], args.count, q),
    )
    proc.start()
    result = q.get(timeout=120)
    proc.join(30)
    rows += [
        ("ring launches/s (wait every 16)", result["launches_per_s"]),
        ("ring round trip p50, us", result["rtt_p50_us"]),
        ("ring round trip p99, us", result["rtt_p99_us"]),
        ("ring errors", result["errors"]),
    ]
    door.close()
    daemon.close()
    work.close()
    if profile is not None:
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    print(f"| {args.backend} | value |\n| --- | --- |")
    for name, value in rows:
        print(f"| {name} | {value:,.1f} |")


if __name__ == "__main__":
    main()
