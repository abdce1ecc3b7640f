"""Where one same-host ring launch spends CPU: the client, the submitter, and the wake-up path.

Run from the repository root (no GPU needed):

    python bench/ring_cost.py [--backend recording|host|cuda] [--count 20000] [--rtt 2000]
                              [--spin auto|on|off] [--profile client|submitter] [--json F]

It runs the daemon's server in this process (its event loop on a thread, the
ring's submitter thread as ``accyd serve`` runs it) and one client in a child
process that uses only the public client API on the Unix socket: saxpy on one
element (``recording``: no device at all, so only accy's own Python shows;
``host``: the CI backend, whose numpy kernels share the daemon's GIL; ``cuda``).
Series:

- *bursts*: ``launch(wait=False)`` in bursts of 256 (fewer than the ring's slots,
  so none blocks), waited after each: the client's wall and CPU time per launch
  (median burst), and the same through ``RingPath.launch_planned`` with a plan
  made once (no ``Session``) and ``Ring.launch`` (the record alone);
- *stream*: ``launch(wait=False)`` with ``session.wait()`` after every 16 (the
  sharing benchmark's one-client loop): launches/s;
- *window*: ``launch(wait=False)`` only, one wait at the end: the pipeline's rate,
  bounded by the slower of the two sides;
- *rtt*: ``launch(wait=True)``, p50 / p99, and (traced, a second run) where one
  round trip goes: the client before its record is published, publish to the
  submitter taking it (and the submitter's poll interval around then), the
  take, take to ``done`` published, ``done`` to the client's return.

The daemon side is measured by wrapping ``ServerRing.take`` and ``settle``:
wall and CPU time per record taken, records per take, and the submitter
thread's CPU time (spinning included). ``--profile`` prints the top functions
of one side (cProfile); ``--spin`` makes the submitter spin as on a machine of
many CPUs, or nap as on one of few (by default: by this machine's CPUs).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import logging
import multiprocessing as mp
import pstats
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import structlog

SAXPY = "accy.kernel.saxpy"
SYNC_EVERY = 16
BURST = 256


# The client process ------------------------------------------------------------------------


def _bursts(
    launch: Callable[[], object], wait: Callable[[], object], bursts: int
) -> dict[str, float]:
    """Launches in bursts of ``BURST`` (fewer than the ring's slots: none blocks), waited after
    each: the median burst's wall and CPU time per launch, in µs."""
    walls, cpus = [], []
    for _ in range(bursts):
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        for _ in range(BURST):
            launch()
        w1, c1 = time.perf_counter_ns(), time.thread_time_ns()
        wait()
        walls.append((w1 - w0) / BURST / 1e3)
        cpus.append((c1 - c0) / BURST / 1e3)
    return {"wall_us": statistics.median(walls), "cpu_us": statistics.median(cpus)}


def _client(target: str, args: dict[str, Any], conn: Any) -> None:
    """One client: the series above, each result sent back over ``conn``."""
    from accy import Client
    from accy._ring import Ring

    count, rtt, bursts = int(args["count"]), int(args["rtt"]), int(args["bursts"])
    profile = cProfile.Profile() if args["profile"] == "client" else None
    out: dict[str, Any] = {}

    def phase(name: str) -> None:
        conn.send(("phase", name))
        conn.recv()

    with Client(target, client_name="ring-cost") as client:
        x = client.buffer(np.ones(1, np.float32))
        y = client.buffer(np.ones(1, np.float32))
        z = client.empty(1, "f32")
        session = client.load(SAXPY)

        def unwaited() -> object:
            return session.launch([x, y], [z], wait=False, n=1, a=1.0)

        def waited() -> object:
            return session.launch([x, y], [z], wait=True, n=1, a=1.0)

        for _ in range(2000):  # warm: the ring opens, handles bind, launches are bound
            unwaited()
        session.wait()
        clock = time.perf_counter_ns

        phase("burst")
        if profile:
            profile.enable()
        out["burst"] = _bursts(unwaited, session.wait, bursts)
        if profile:
            profile.disable()

        phase("stream")  # the sharing benchmark's loop: wait after every 16
        started = clock()
        for i in range(count):
            unwaited()
            if i % SYNC_EVERY == SYNC_EVERY - 1:
                session.wait()
        session.wait()
        out["stream_per_s"] = count / (clock() - started) * 1e9

        phase("window")  # no waits but the last: the ring's slots bound what is in flight
        started = clock()
        for _ in range(count):
            unwaited()
        session.wait()
        out["window_per_s"] = count / (clock() - started) * 1e9

        phase("rtt")
        times = []
        for _ in range(rtt):
            t0 = clock()
            waited()
            times.append(clock() - t0)
        times.sort()
        out["rtt_p50_us"] = times[len(times) // 2] / 1e3
        out["rtt_p99_us"] = times[int(len(times) * 0.99)] / 1e3

        phase("trace")  # when each record was published; the daemon traces its side
        ring = session._ring
        assert ring is not None, "the session did not launch on a ring"
        publish = Ring._publish
        marks: list[int] = []

        def traced(self: Ring) -> int:
            marks.append(clock())
            return publish(self)

        Ring._publish = traced  # type: ignore[method-assign]
        trace = []
        try:
            for _ in range(rtt):
                t0 = clock()
                waited()
                trace.append((ring.ring.head - 1, t0, marks[-1], clock()))
        finally:
            Ring._publish = publish  # type: ignore[method-assign]
        out["trace"] = trace

        phase("path")  # the ring path without Session: a kept plan and the scalars
        specs = session._ring_specs
        assert specs is not None
        plan, changes = ring.plan(session.id, specs, [x.id, y.id], [z.id], 10.0)
        values = {"n": 1, "a": 1.0}
        out["path"] = _bursts(
            lambda: ring.launch_planned(plan, changes, values, wait=False, timeout=10.0),
            lambda: ring.wait(None, 10.0),
            bursts,
        )

        phase("ring")  # the record alone: Ring.launch on the session's own handles
        raw = ring.ring
        handle, packer, _ = ring._sessions[session.id]
        hx, hy, hz = (ring._buffers[b.id] for b in (x, y, z))
        scalars = packer.pack(1, 1.0)
        with ring.lock:
            out["ring"] = _bursts(
                lambda: raw.launch(handle, [hx, hy], [hz], scalars, 2, notify=False, timeout=10),
                lambda: raw.wait(raw.head - 1, 10),
                bursts,
            )
        ring.wait(None, 10)
        if args["check"]:  # the recording backend runs no kernel
            np.testing.assert_array_equal(z.read(), np.full(1, 2.0, np.float32))
    if profile:
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
        out["profile"] = text.getvalue()
    conn.send(("done", out))


# The daemon, instrumented -------------------------------------------------------------------


class Meter:
    """Time the submitter spends in ``take`` and ``settle``; traced timestamps by record."""

    def __init__(self, profile: bool) -> None:
        self.take_ns = self.take_cpu_ns = self.settle_ns = self.idle_ns = 0
        self.taken = self.batches = self.settles = 0
        self.tracing = False
        self.taken_at: dict[int, tuple[int, int]] = {}
        self.polled_before: dict[int, int] = {}
        self.last_poll = 0
        self.done_at: dict[int, int] = {}
        self.profile = cProfile.Profile() if profile else None
        self.cpu_clock: int | None = None

    def reset(self) -> None:
        self.take_ns = self.take_cpu_ns = self.settle_ns = self.idle_ns = 0
        self.taken = self.batches = self.settles = 0

    def install(self) -> None:
        from accyd.ring.ring import ServerRing

        take, settle = ServerRing.take, ServerRing.settle
        clock, cpu = time.perf_counter_ns, time.thread_time_ns
        meter = self

        def timed_take(ring: ServerRing, limit: int) -> int:
            if meter.cpu_clock is None:
                meter.cpu_clock = time.pthread_getcpuclockid(threading.get_ident())
            first = ring._tail
            c0, t0 = cpu(), clock()
            if meter.profile is not None:
                taken = meter.profile.runcall(take, ring, limit)
            else:
                taken = take(ring, limit)
            t1, c1 = clock(), cpu()
            last_poll, meter.last_poll = meter.last_poll, t0
            if taken:
                if meter.tracing:
                    meter.polled_before[first] = last_poll
                meter.take_ns += t1 - t0
                meter.take_cpu_ns += c1 - c0
                meter.taken += taken
                meter.batches += 1
                if meter.tracing:
                    for seq in range(first, first + taken):
                        meter.taken_at[seq] = (t0, t1)
            else:
                meter.idle_ns += t1 - t0
            return taken

        def timed_settle(ring: ServerRing) -> bool:
            before = ring._done
            t0 = clock()
            if meter.profile is not None:
                moved = meter.profile.runcall(settle, ring)
            else:
                moved = settle(ring)
            t1 = clock()
            if moved:
                meter.settle_ns += t1 - t0
                meter.settles += 1
                if meter.tracing:
                    for seq in range(before, ring._done):
                        meter.done_at[seq] = t1
            else:
                meter.idle_ns += t1 - t0
            return moved

        ServerRing.take = timed_take  # type: ignore[method-assign]
        ServerRing.settle = timed_settle  # type: ignore[method-assign]

    def cpu_ns(self) -> int:
        return 0 if self.cpu_clock is None else time.clock_gettime_ns(self.cpu_clock)


class ServerThread:
    """``accyd.server.Server`` on an event loop of its own thread, on a Unix socket (and
    ``tcp``, an address, if given); ``settings`` go to its ``Config``."""

    def __init__(
        self, folder: Path, backend_name: str, tcp: str | None = None, **settings: Any
    ) -> None:
        from accyd.catalog import load_catalog
        from accyd.config import Config
        from accyd.server import Server

        backend: Any
        if backend_name == "recording":
            from accyd.testing.recording import RecordingBackend

            backend = RecordingBackend()
        else:
            from accyd.backends.select import make_backend

            backend = make_backend(backend_name)
        listen = (f"unix:{folder / 'accyd.sock'}", *([tcp] if tcp else []))
        config = Config(listen=listen, insecure=True, log_level="warning", **settings).validate()
        self.server = Server(config, backends={0: backend}, catalog=load_catalog())
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.call(self.server.start())
        self.target = self.server.addresses[0]

    def call(self, coroutine: Any, timeout: float = 30.0) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return future.result(timeout)

    def stop(self) -> None:
        self.call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


# The run ------------------------------------------------------------------------------------


def _per(meter: Meter, cpu0: int) -> dict[str, float]:
    taken = max(meter.taken, 1)
    return {
        "take_us_per_record": meter.take_ns / taken / 1e3,
        "take_cpu_us_per_record": meter.take_cpu_ns / taken / 1e3,
        "records_per_batch": meter.taken / max(meter.batches, 1),
        "settle_us_per_record": meter.settle_ns / taken / 1e3,
        "settle_us_per_call": meter.settle_ns / max(meter.settles, 1) / 1e3,
        "submitter_cpu_us_per_record": (meter.cpu_ns() - cpu0) / taken / 1e3,
    }


def _phases(trace: list[tuple[int, int, int, int]], meter: Meter) -> dict[str, float]:
    """Median of each part of a traced round trip (clocks are CLOCK_MONOTONIC in both)."""
    parts: dict[str, list[float]] = {
        "client before publish": [],
        "publish -> take starts": [],
        "  poll interval around it": [],
        "take": [],
        "take ends -> done published": [],
        "done published -> client returns": [],
    }
    for seq, t0, published, t1 in trace:
        if seq not in meter.taken_at or seq not in meter.done_at:
            continue
        took0, took1 = meter.taken_at[seq]
        done = meter.done_at[seq]
        poll = took0 - meter.polled_before.get(seq, took0)
        for name, value in zip(
            parts,
            (published - t0, took0 - published, poll, took1 - took0, done - took1, t1 - done),
            strict=True,
        ):
            parts[name].append(value / 1e3)
    return {name: statistics.median(values) for name, values in parts.items() if values}


def run(
    backend: str, count: int, rtt: int, bursts: int, profile: str, spin: str = "auto"
) -> dict[str, Any]:
    if spin != "auto":  # as on a machine of many CPUs (on) or few (off)
        from accyd.ring import submitter

        submitter.SPIN_CPUS = 0 if spin == "on" else 1 << 20
    meter = Meter(profile == "submitter")
    meter.install()
    folder = Path(tempfile.mkdtemp(prefix="accy-ring-cost-"))
    server = ServerThread(folder, backend)
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    settings = {
        "count": count,
        "rtt": rtt,
        "bursts": bursts,
        "profile": profile,
        "check": backend != "recording",
    }
    child = ctx.Process(target=_client, args=(server.target, settings, there))
    result: dict[str, Any] = {}
    try:
        child.start()
        cpu0 = meter.cpu_ns()
        sides: dict[str, dict[str, float]] = {}
        current = "warm"
        while True:
            if not here.poll(300):
                raise TimeoutError("the client process stopped answering")
            kind, value = here.recv()
            if kind == "done":
                result = value
                break
            sides[current] = _per(meter, cpu0)
            current = value
            meter.tracing = current == "trace"
            meter.reset()
            cpu0 = meter.cpu_ns()
            here.send("go")
        result["submitter"] = sides
        result["phases"] = _phases(result.pop("trace"), meter)
    finally:
        child.join(60)
        if child.is_alive():
            child.kill()
        server.stop()
    if meter.profile is not None:
        text = io.StringIO()
        pstats.Stats(meter.profile, stream=text).sort_stats("tottime").print_stats(25)
        result["profile"] = text.getvalue()
    return result


def report(backend: str, result: dict[str, Any]) -> str:
    from accy._table import markdown

    sides = result["submitter"]
    burst, path, ring = result["burst"], result["path"], result["ring"]
    rows = [
        [
            "client: Session.launch, µs each (wall / CPU)",
            f"{burst['wall_us']:.2f} / {burst['cpu_us']:.2f}",
        ],
        [
            "client: RingPath.launch_planned (no Session), µs each (wall / CPU)",
            f"{path['wall_us']:.2f} / {path['cpu_us']:.2f}",
        ],
        [
            "client: Ring.launch alone, µs each (wall / CPU)",
            f"{ring['wall_us']:.2f} / {ring['cpu_us']:.2f}",
        ],
    ]
    for name in ("burst", "stream", "window"):
        side = sides[name]
        rows += [
            [
                f"submitter in {name}: take µs per record (wall / CPU)",
                f"{side['take_us_per_record']:.2f} / {side['take_cpu_us_per_record']:.2f}",
            ],
            [f"submitter in {name}: records per take", f"{side['records_per_batch']:.1f}"],
            [f"submitter in {name}: settle µs per record", f"{side['settle_us_per_record']:.2f}"],
            [
                f"submitter in {name}: thread CPU µs per record (spin too)",
                f"{side['submitter_cpu_us_per_record']:.2f}",
            ],
        ]
    rows += [
        [f"stream (wait every {SYNC_EVERY}): launches/s", f"{result['stream_per_s']:,.0f}"],
        ["window (one wait at the end): launches/s", f"{result['window_per_s']:,.0f}"],
        ["round trip p50 / p99, µs", f"{result['rtt_p50_us']:.1f} / {result['rtt_p99_us']:.1f}"],
    ]
    rows += [
        [f"traced round trip: {name}", f"{value:.1f}"] for name, value in result["phases"].items()
    ]
    return f"ring cost, {backend} backend, saxpy n=1\n" + markdown(["series", "value"], rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="recording", help="recording, host or cuda")
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--rtt", type=int, default=2000)
    parser.add_argument("--bursts", type=int, default=60, help=f"of {BURST} launches")
    parser.add_argument("--profile", choices=("", "client", "submitter"), default="")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--spin",
        choices=("auto", "on", "off"),
        default="auto",
        help="the submitter spins between rounds: by CPU count, or as if on many or few",
    )
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    result = run(args.backend, args.count, args.rtt, args.bursts, args.profile, args.spin)
    if "profile" in result:
        print(result.pop("profile"))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    print(report(args.backend, result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
