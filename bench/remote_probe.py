"""Where a waited remote launch's round trip goes, on the client's side of a RingStream.

Run from the repository root:

    python bench/remote_probe.py [--backend host|cuda] [--iterations 2000]

It starts ``accyd serve`` on TCP loopback and one client in this process, and
times each waited launch of saxpy (n = 64) in three legs by wrapping the
client's ``RingStream`` call: from the call to ``Session.launch`` until its
frame is handed to gRPC (the caller, the record, the sender thread's wake-up),
from there until the daemon's answer is read by the reader thread (the wire
both ways and everything the daemon does), and from there until
``Session.launch`` returns (the reader waking the caller). A raw streaming
gRPC echo of a frame's size, on its own server, is timed alongside (the
floor of the middle leg). It prints p50 of each, in µs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
from bench_service import EchoServer, _channel, _StreamEcho

from accy import _rpc
from accy._table import markdown
from accy.client import Client
from accy.testing import free_port, running_daemon

SAXPY = "accy.kernel.saxpy"

_sent: list[float] = []
_read: list[float] = []


class _Timed:
    """A RingStream call whose frames and answers are stamped as they pass."""

    def __init__(self, call: Any) -> None:
        self._call = call

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        state = next(self._call)
        _read.append(time.perf_counter())
        return state

    def cancel(self) -> None:
        self._call.cancel()


def _stamped(frames: Iterator[Any]) -> Iterator[Any]:
    for frame in frames:
        _sent.append(time.perf_counter())
        yield frame


def _patch() -> None:
    original = _rpc.Stub.__init__

    def init(self: _rpc.Stub, channel: Any) -> None:
        original(self, channel)
        plain = self.RingStream

        def ring_stream(frames: Iterator[Any], **kwargs: Any) -> _Timed:
            return _Timed(plain(_stamped(frames), **kwargs))

        self.RingStream = ring_stream  # type: ignore[assignment]

    _rpc.Stub.__init__ = init  # type: ignore[method-assign]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="host")
    parser.add_argument("--iterations", type=int, default=2000)
    args = parser.parse_args()
    _patch()
    n = 64
    legs: dict[str, list[float]] = {"to gRPC": [], "gRPC to reader": [], "reader to caller": []}
    whole: list[float] = []
    with running_daemon(backend=args.backend) as daemon:
        assert daemon.tcp_target is not None
        with Client(daemon.tcp_target, client_name="remote-probe") as client:
            x = client.buffer(np.ones(n, np.float32))
            out = client.empty(n, "f32")
            session = client.load(SAXPY)
            for _ in range(200):
                session.launch([x, x], [out], n=n, a=1.0)
            for _ in range(args.iterations):
                sent, read = len(_sent), len(_read)
                started = time.perf_counter()
                session.launch([x, x], [out], n=n, a=1.0)
                ended = time.perf_counter()
                if len(_sent) != sent + 1 or len(_read) != read + 1:
                    continue  # a frame or an answer more than the one launch's: not one trip
                legs["to gRPC"].append(_sent[-1] - started)
                legs["gRPC to reader"].append(_read[-1] - _sent[-1])
                legs["reader to caller"].append(ended - _read[-1])
                whole.append(ended - started)
            np.testing.assert_array_equal(out.read(), np.full(n, 2.0, np.float32))
    rows = [[name, f"{statistics.median(v) * 1e6:.1f}"] for name, v in legs.items()]
    rows.append(["whole launch (p50)", f"{statistics.median(whole) * 1e6:.1f}"])
    rows.append(["clean trips", str(len(whole))])
    rows.append(["streaming echo (p50)", f"{_echo(args.iterations) * 1e6:.1f}"])
    print(f"waited remote launches through RingStream, {args.backend} backend, saxpy n={n}")
    print(markdown(["leg", "µs"], rows))
    return 0


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


if __name__ == "__main__":
    sys.exit(main())
