"""Where one same-host ring launch spends CPU: the client, and the daemon behind its ring.

Run from the repository root (no GPU needed):

    python bench/ring_cost.py [--backend recording|host|cuda] [--count 20000] [--rtt 2000]
                              [--engine auto|native|python] [--profile client] [--json F]

It runs the daemon's server in this process (its event loop on a thread, the
ring engine as ``accyd serve`` runs it) and one client in a child
process that uses only the public client API on the Unix socket: saxpy on one
element (``recording``: no device at all, so only accy's own Python shows;
``host``: the CI backend, whose numpy kernels share the daemon's GIL; ``cuda``).
Series:

- *bursts*: ``launch(wait=False)`` in bursts of 256 (fewer than the ring's slots,
  so none blocks), waited after each: the client's wall and CPU time per launch
  (median burst), and the same through the link's transport alone
  (``RingLaunches.launch``, no ``Session``) and ``Ring.launch`` (the record alone);
- *stream*: ``launch(wait=False)`` with ``session.wait()`` after every 16 (the
  sharing benchmark's one-client loop): launches/s;
- *window*: ``launch(wait=False)`` only, one wait at the end: the pipeline's rate,
  bounded by the slower of the two sides;
- *rtt*: ``launch(wait=True)``, p50 / p99.

The daemon's side of each series: how many records the engine launched by ticket
and how many it handed to Python, and the daemon process's CPU time per record
(the native engine's threads run outside the GIL; they spin while work is in
flight). ``--engine`` picks the engine; ``--profile client`` prints the client's
top functions (cProfile).
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
    from accy._ring_path import RingLaunches
    from accy._seam import LaunchRequest, WaitRequest
    from accy.testing import transport_of

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

        transport = transport_of(client)
        assert transport.path == "ring", "not launched on a ring"
        ring = getattr(transport, "launches", None)
        assert isinstance(ring, RingLaunches)

        phase("path")  # the transport without Session: its kept record and the scalars
        values = {"n": 1, "a": 1.0}
        operands, results = [x, y], [z]
        out["path"] = _bursts(
            lambda: ring.launch(LaunchRequest(session, operands, results, values, False, 10.0)),
            lambda: ring.wait(WaitRequest(None, session.id, 10.0)),
            bursts,
        )

        phase("ring")  # the record alone: Ring.launch on the session's own handles
        raw = ring.ring
        handle, record_scalars = ring._sessions[session.id]
        hx, hy, hz = (ring._buffers[b.id] for b in (x, y, z))
        scalars = record_scalars.packer.pack(1, 1.0)
        with ring.lock:
            out["ring"] = _bursts(
                lambda: raw.launch(handle, [hx, hy], [hz], scalars, 2, notify=False, timeout=10),
                lambda: raw.wait(raw.head - 1, 10),
                bursts,
            )
        ring.wait(WaitRequest(None, session.id, 10))
        if args["check"]:  # the recording backend runs no kernel
            np.testing.assert_array_equal(z.read(), np.full(1, 2.0, np.float32))
    if profile:
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
        out["profile"] = text.getvalue()
    conn.send(("done", out))


# The daemon, measured ----------------------------------------------------------------------


class Meter:
    """The daemon's side of each phase: its process's CPU time (the event loop, the engine's
    threads) and the engine's own counts of records it launched by ticket and handed to
    Python, per record the client published."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.reset()

    def reset(self) -> None:
        self.cpu0 = time.process_time()
        self.stats0 = self.engine.stats() if self.engine is not None else {}

    def side(self) -> dict[str, float]:
        now = self.engine.stats() if self.engine is not None else {}
        fast = now.get("fast_records", 0) - self.stats0.get("fast_records", 0)
        slow = now.get("slow_records", 0) - self.stats0.get("slow_records", 0)
        records = max(fast + slow, 1)
        return {
            "ticketed_records": fast,
            "python_records": slow,
            "daemon_cpu_us_per_record": (time.process_time() - self.cpu0) / records * 1e6,
        }


class ServerThread:
    """``accyd.server.Server`` on an event loop of its own thread, on a Unix socket (and
    ``tcp``, an address, if given); ``settings`` go to its ``Config``."""

    def __init__(
        self, folder: Path, backend_name: str, tcp: str | None = None, **settings: Any
    ) -> None:
        from accyd.catalog import load_catalog
        from accyd.server import Server
        from accyd.settings.config import Config

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


def run(
    backend: str, count: int, rtt: int, bursts: int, profile: str, engine: str = "auto"
) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="accy-ring-cost-"))
    server = ServerThread(folder, backend, engine=engine)
    doors = server.server.ring_doors
    meter = Meter(None if doors is None else doors.engine)
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
        sides: dict[str, dict[str, float]] = {}
        current = "warm"
        while True:
            if not here.poll(300):
                raise TimeoutError("the client process stopped answering")
            kind, value = here.recv()
            if kind == "done":
                result = value
                break
            sides[current] = meter.side()
            current = value
            meter.reset()
            here.send("go")
        result["daemon"] = sides
        result["engine"] = None if doors is None else doors.engine.kind
        result.pop("trace", None)
    finally:
        child.join(60)
        if child.is_alive():
            child.kill()
        server.stop()
    return result


def report(backend: str, result: dict[str, Any]) -> str:
    from accy._table import markdown

    sides = result["daemon"]
    burst, path, ring = result["burst"], result["path"], result["ring"]
    rows = [
        [
            "client: Session.launch, µs each (wall / CPU)",
            f"{burst['wall_us']:.2f} / {burst['cpu_us']:.2f}",
        ],
        [
            "client: RingLaunches.launch (no Session), µs each (wall / CPU)",
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
                f"daemon in {name}: records by ticket / by Python",
                f"{side['ticketed_records']:,.0f} / {side['python_records']:,.0f}",
            ],
            [
                f"daemon in {name}: process CPU µs per record (engine spin too)",
                f"{side['daemon_cpu_us_per_record']:.2f}",
            ],
        ]
    rows += [
        [f"stream (wait every {SYNC_EVERY}): launches/s", f"{result['stream_per_s']:,.0f}"],
        ["window (one wait at the end): launches/s", f"{result['window_per_s']:,.0f}"],
        ["round trip p50 / p99, µs", f"{result['rtt_p50_us']:.1f} / {result['rtt_p99_us']:.1f}"],
    ]
    return f"ring cost, {backend} backend, {result['engine']} engine, saxpy n=1\n" + markdown(
        ["series", "value"], rows
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="recording", help="recording, host or cuda")
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--rtt", type=int, default=2000)
    parser.add_argument("--bursts", type=int, default=60, help=f"of {BURST} launches")
    parser.add_argument("--profile", choices=("", "client"), default="")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--engine", choices=("auto", "native", "python"), default="auto", help="the ring engine"
    )
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    result = run(args.backend, args.count, args.rtt, args.bursts, args.profile, args.engine)
    if "profile" in result:
        print(result.pop("profile"))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    print(report(args.backend, result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
