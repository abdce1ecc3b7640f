"""One client of the waiting crowd (test_waiting_crowd.py): waited saxpy launches for a while.

Run as ``python crowd_client.py TARGET SECONDS``; prints one JSON line: the launches it
finished and their latency percentiles, in milliseconds.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from accy import Client

SAXPY = "accy.kernel.saxpy"
N = 1024


def main(target: str, seconds: float) -> None:
    with Client(target, client_name="crowd") as client:
        session = client.load(SAXPY)
        xs = client.buffer(np.ones(N, np.float32))
        ys = client.buffer(np.zeros(N, np.float32))
        session.launch(operands=[xs, ys], results=[ys], n=N, a=1.0, wait=True)  # warm
        print("ready", flush=True)
        sys.stdin.readline()  # every client starts together
        took = []
        end = time.monotonic() + seconds
        while (now := time.monotonic()) < end:
            session.launch(operands=[xs, ys], results=[ys], n=N, a=1.0, wait=True)
            took.append(time.monotonic() - now)
        assert ys.read()[0] == 1 + len(took), "every launch ran, in order"
        ms = np.array(took) * 1000
        print(
            json.dumps(
                {
                    "count": len(took),
                    "p50_ms": float(np.percentile(ms, 50)),
                    "p99_ms": float(np.percentile(ms, 99)),
                    "max_ms": float(ms.max()),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
