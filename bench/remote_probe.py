"""Where a waited remote launch's round trip goes, leg by leg, on both sides of a RingStream.

Run from the repository root:

    python bench/remote_probe.py [--backend host|cuda] [--iterations 2000]

It runs the daemon's server in this process (its event loop on a thread, as
``bench/ring_cost.py`` does) on TCP loopback, and one client in a child
process that uses the public client API, and times each waited launch of
saxpy (n = 64) by stamping (``CLOCK_MONOTONIC``, the same clock in both
processes): in the client, the call to ``Session.launch``, its frame handed to
gRPC (the call's request iterator) and the daemon's answer read (the reader
thread), and the return; in the daemon, ``StreamRing.take`` entered, its
answer built, and the answer written. A raw streaming gRPC echo of a frame's
size, on its own server, is timed after (the floor). It prints p50 of each
leg, in µs.
"""

from __future__ import annotations

import argparse
import bisect
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from bench_service import EchoServer, _channel, _StreamEcho
from ring_cost import ServerThread

from accy._table import markdown
from accy.testing import free_port

SAXPY = "accy.kernel.saxpy"
N = 64


# The client (a child process) -------------------------------------------------------------


def _client(target: str, iterations: int, out: Any) -> None:
    """Waited launches, each stamped: (called, frame to gRPC, answer read, returned)."""
    from accy import _rpc
    from accy.client import Client

    sent: list[float] = []
    read: list[float] = []

    class Timed:
        def __init__(self, call: Any) -> None:
            self._call = call

        def __iter__(self) -> Iterator[Any]:
            return self

        def __next__(self) -> Any:
            state = next(self._call)
            read.append(time.perf_counter())
            return state

        def cancel(self) -> None:
            self._call.cancel()

    def stamped(frames: Iterator[Any]) -> Iterator[Any]:
        for frame in frames:
            sent.append(time.perf_counter())
            yield frame

    original = _rpc.Stub.__init__

    def init(self: Any, channel: Any) -> None:
        original(self, channel)
        plain = self.RingStream
        self.RingStream = lambda frames, **kw: Timed(plain(stamped(frames), **kw))

    _rpc.Stub.__init__ = init  # type: ignore[method-assign]
    trips: list[tuple[float, float, float, float]] = []
    with Client(target, client_name="remote-probe") as client:
        x, y = client.buffer(np.ones(N, np.float32)), client.empty(N, "f32")
        session = client.load(SAXPY)
        for _ in range(200):
            session.launch([x, x], [y], n=N, a=1.0)
        for _ in range(iterations):
            frames, answers = len(sent), len(read)
            started = time.perf_counter()
            session.launch([x, x], [y], n=N, a=1.0)
            ended = time.perf_counter()
            if len(sent) == frames + 1 and len(read) == answers + 1:  # one frame, one answer
                trips.append((started, sent[-1], read[-1], ended))
        np.testing.assert_array_equal(y.read(), np.full(N, 2.0, np.float32))
    out.put(trips)


# The daemon's stamps -----------------------------------------------------------------------

_frames: list[tuple[float, float, float]] = []
"""Per frame taken: entered, answer built, answer written."""


def _stamp_daemon() -> None:
    from accyd.ring.stream import StreamRing

    ring = StreamRing
    take, state = ring.take, ring._state
    built: list[float] = []

    def timed_take(self: Any, first: int, records: bytes) -> bool:
        entered = time.perf_counter()
        count = len(built)
        waits = take(self, first, records)
        written = time.perf_counter()
        _frames.append((entered, built[-1] if len(built) > count else written, written))
        return waits

    def timed_state(self: Any) -> Any:
        answer = state(self)
        if answer is not None:
            built.append(time.perf_counter())
        return answer

    ring.take = timed_take  # type: ignore[method-assign]
    ring._state = timed_state  # type: ignore[method-assign]


def _legs(trips: list[tuple[float, float, float, float]]) -> dict[str, list[float]]:
    legs: dict[str, list[float]] = {
        "client: Session.launch -> frame to gRPC": [],
        "wire in: frame to gRPC -> daemon takes it": [],
        "daemon: take (checks, launch, spin, settle) -> answer built": [],
        "daemon: answer built -> written": [],
        "wire out: answer built -> client reader has it": [],
        "client: reader -> Session.launch returns": [],
        "whole launch": [],
    }
    entered = [frame[0] for frame in _frames]
    for called, sent, read, returned in trips:
        at = bisect.bisect_left(entered, sent)
        if at == len(entered) or entered[at] > read:
            continue
        taken, built, written = _frames[at]
        for name, value in zip(
            legs,
            (
                sent - called,
                taken - sent,
                built - taken,
                written - built,
                read - built,
                returned - read,
                returned - called,
            ),
            strict=True,
        ):
            legs[name].append(value)
    return legs


def _echo(iterations: int) -> float:
    """p50 of a raw streaming echo of one record's frame (256 bytes and framing)."""
    address = f"127.0.0.1:{free_port()}"
    server = EchoServer([address])
    try:
        echo = _StreamEcho(_channel(address))
        payload = bytes(270)
        for _ in range(200):
            echo(payload)
        samples = []
        for _ in range(iterations):
            started = time.perf_counter()
            echo(payload)
            samples.append(time.perf_counter() - started)
        echo.close()
    finally:
        server.close()
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="host")
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument(
        "--loop-spin-us", type=float, default=None, help="the daemon's event loop spin (auto)"
    )
    args = parser.parse_args()
    settings = {}
    if args.loop_spin_us is not None:
        settings["loop_spin_seconds"] = args.loop_spin_us / 1e6
    _stamp_daemon()
    tcp = f"127.0.0.1:{free_port()}"
    with tempfile.TemporaryDirectory(prefix="accy-probe-") as folder:
        server = ServerThread(Path(folder), args.backend, tcp, **settings)
        try:
            context = mp.get_context("spawn")
            results = context.Queue()
            child = context.Process(target=_client, args=(tcp, args.iterations, results))
            child.start()
            trips = results.get(timeout=600)
            child.join(30)
        finally:
            server.stop()
    legs = _legs(trips)
    rows = [[name, f"{statistics.median(v) * 1e6:.1f}"] for name, v in legs.items() if v]
    rows.append(["trips matched", f"{len(legs['whole launch'])} of {args.iterations}"])
    rows.append(["raw streaming echo, whole", f"{_echo(args.iterations) * 1e6:.1f}"])
    spin = "auto" if args.loop_spin_us is None else f"{args.loop_spin_us:g} us"
    print(
        f"waited remote launches through RingStream, {args.backend} backend, saxpy n={N}, "
        f"loop spin {spin}, p50"
    )
    print(markdown(["leg", "µs"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
