"""What a launch costs when its scalars change: the same each time, some in turn, new each time.

Run from the repository root:

    python bench/changing_scalars.py [--backend host|cuda] [--count 3000] [--engines native,python]

For each ring engine (``ACCYD_ENGINE``) it starts ``accyd serve``, and one client on the
local ring launches ``accy.kernel.saxpy`` ``--count`` times, waited and with a wait every
16, with ``a``: the same every launch; cycling through 32 values (within the 64 launches a
session keeps prepared); cycling through 100 (past them); new every launch; and, with ``a``
the same, ``n`` (which sizes the launch) cycling through 100 values.

``a`` is a free scalar (no check reads it): where the backend's prepared launches take new
values (the host backend), the engine replays one checked launch with each new ``a``,
patched in. ``n`` is not: each value is another launch, checked and prepared once, and
100 values are more than a session keeps prepared (64), so that row measures the checked
path. It prints a markdown table: µs
per launch, and the ratio to the same-scalar row of the same engine and waiting.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import numpy as np

from accy import Buffer, Client, Session
from accy._table import markdown
from accy.testing import running_daemon

SAXPY = "accy.kernel.saxpy"
N = 128
PATTERNS: dict[str, Callable[[int], tuple[int, float]]] = {
    "a the same": lambda i: (N, 1.0),
    "a: 32 in turn": lambda i: (N, float(i % 32)),
    "a: 100 in turn": lambda i: (N, float(i % 100)),
    "a new each launch": lambda i: (N, float(i)),
    "n: 100 in turn": lambda i: (1 + i % 100, 1.0),
}
"""(n, a) for launch i."""


def timed(
    session: Session,
    x: Buffer,
    y: Buffer,
    count: int,
    waited: bool,
    scalars: Callable[[int], tuple[int, float]],
) -> float:
    """Seconds per launch of ``count`` launches of ``y[:n] = a * x[:n] + y[:n]``."""
    started = time.perf_counter()
    for i in range(count):
        n, a = scalars(i)
        session.launch(operands=[x, y], results=[y], n=n, a=a, wait=waited)
        if not waited and i % 16 == 15:
            session.wait()
    session.wait()
    return (time.perf_counter() - started) / count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="host")
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--engines", default="native,python")
    args = parser.parse_args()
    rows: list[list[str]] = []
    for engine in args.engines.split(","):
        env = {"ACCYD_ENGINE": engine}
        with (
            running_daemon(backend=args.backend, env=env) as daemon,
            Client(daemon.unix_target) as client,
        ):
            session = client.load(SAXPY)
            x = client.buffer(np.ones(N, np.float32))
            y = client.buffer(np.zeros(N, np.float32))
            for waited in (True, False):
                timed(session, x, y, min(args.count, 500), waited, PATTERNS["a the same"])  # warm
                base = 0.0
                for name, pattern in PATTERNS.items():
                    seconds = timed(session, x, y, args.count, waited, pattern)
                    base = base or seconds
                    wait = "waited" if waited else "a wait every 16"
                    rows.append(
                        [engine, wait, name, f"{seconds * 1e6:.1f}", f"{seconds / base:.2f}"]
                    )
            expected = np.zeros(N, np.float32)
            for _ in range(2):  # what the loops above added to y, in their order
                expected += np.float32(min(args.count, 500))
                for pattern in PATTERNS.values():
                    for i in range(args.count):
                        n, a = pattern(i)
                        expected[:n] += np.float32(a)
            np.testing.assert_allclose(y.read(), expected, rtol=1e-4)
    print(f"one ring client, {args.backend} backend, saxpy, {args.count} launches a row")
    print(markdown(["engine", "launches", "scalars", "µs each", "x the same"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
