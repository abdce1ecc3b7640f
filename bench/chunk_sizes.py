"""Buffer write and read throughput by chunk size, through the client library.

Run from the repository root; starts its own ``accyd serve`` on a temporary Unix
socket and moves 64 MiB each way at each chunk size (best of ``--repeat``):

    python bench/chunk_sizes.py [--backend host|cuda] [--repeat N] [--json [PATH]]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from accy import Client
from accy._chunks import MAX_CHUNK_SIZE
from accy._table import markdown
from accy.testing import running_daemon

MiB = 1 << 20
SIZES = (256 << 10, 1 * MiB, 2 * MiB, MAX_CHUNK_SIZE)


def measure(target: str, nbytes: int, repeat: int) -> list[dict[str, float]]:
    data = np.random.default_rng(3).integers(0, 255, nbytes, dtype=np.uint8)
    rows = []
    with Client(target, client_name="chunks") as client:
        buffer = client.empty(nbytes, "u8")
        buffer.write(data)
        buffer.read()
        for size in SIZES:
            writes, reads = [], []
            for _ in range(repeat):
                started = time.perf_counter()
                buffer.write(data, chunk_size=size)
                writes.append(time.perf_counter() - started)
                started = time.perf_counter()
                back = buffer.read(chunk_size=size)
                reads.append(time.perf_counter() - started)
                assert np.array_equal(back, data)
            rows.append(
                {"chunk_bytes": size, "write_gbps": nbytes / min(writes) / 1e9,
                 "read_gbps": nbytes / min(reads) / 1e9}
            )  # fmt: skip
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="host", choices=("host", "cuda"))
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", nargs="?", const="-", metavar="PATH")
    args = parser.parse_args()
    with running_daemon(backend=args.backend, tcp=False) as daemon:
        rows = measure(daemon.unix_target, 64 * MiB, args.repeat)
    if args.json == "-":
        print(json.dumps({"backend": args.backend, "rows": rows}, indent=2))
    elif args.json:
        Path(args.json).write_text(json.dumps({"backend": args.backend, "rows": rows}, indent=2))
    table = [
        [f"{r['chunk_bytes'] / 1024:.0f} KiB", f"{r['write_gbps']:.3f}", f"{r['read_gbps']:.3f}"]
        for r in rows
    ]
    print(markdown(["chunk", "write GB/s", "read GB/s"], table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
