"""Launches per second of one client over TCP loopback: waited, and pipelined (wait=False).

Run from the repository root:

    python bench/launch_rate.py [--backend host|cuda] [--count 20000] [--n 64]

It starts ``accyd serve`` on loopback TCP, loads ``accy.kernel.saxpy`` and
times, for one client: waited launches one after another, and launches made
with ``wait=False`` followed by one ``Session.wait`` (pipelined up to the
client's launch window). It prints a markdown table.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from accy._table import markdown
from accy.client import Client
from accy.testing import running_daemon

SAXPY = "accy.kernel.saxpy"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="host")
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--n", type=int, default=64)
    args = parser.parse_args()
    n, count = args.n, args.count
    rows: list[list[str]] = []
    with running_daemon(backend=args.backend) as daemon:
        assert daemon.tcp_target is not None
        with Client(daemon.tcp_target, client_name="launch-rate") as client:
            x = client.buffer(np.ones(n, np.float32))
            y = client.buffer(np.ones(n, np.float32))
            out = client.empty(n, "f32")
            session = client.load(SAXPY)
            for wait, label in ((True, "waited"), (False, "wait=False, one wait at the end")):
                for _ in range(min(count, 1000)):  # warm up
                    session.launch([x, y], [out], wait=wait, n=n, a=2.0)
                session.wait()
                started = time.perf_counter()
                for _ in range(count):
                    session.launch([x, y], [out], wait=wait, n=n, a=2.0)
                session.wait()
                seconds = time.perf_counter() - started
                rows.append([label, f"{count / seconds:,.0f}", f"{seconds / count * 1e6:.1f}"])
            np.testing.assert_array_equal(out.read(), np.full(n, 3.0, np.float32))
    print(f"one client over TCP loopback, {args.backend} backend, saxpy n={n}, {count} launches")
    print(markdown(["launches", "per second", "µs each"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
