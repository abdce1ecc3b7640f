"""The first transfer of a new size: a fresh client's one-shot 1 GiB write and read.

A fresh segment is not page-locked: its first copies go through the daemon's
fixed pool of pinned staging slots (``accyd.backends.staging``), and it is
locked in the background only once its copies moved 8 times its size. This
times, in one run against ``accyd serve`` on a Unix socket:

- the yardstick: an in-process ``cuMemcpyHtoD``/``DtoH`` from ``cuMemHostAlloc``
  memory (CUDA only);
- per round, a fresh client: a new ``Client.shared_array`` (a new segment, no
  copy on the client's side) written to a buffer once and read back once, each
  timed alone (the first transfer), then the same again (the second);
- the same segment after ``--warm`` more round trips and its locking (the warm rate);
- per round, a fresh client's ``client.buffer(array)`` and ``read()`` of an
  ordinary numpy array (the README's path: one more copy on the client's side).

Every result is checked. The goal (issue 23): first write and first read at
least 0.5 of the in-process pinned copy.

    python bench/first_transfer.py [--backend cuda|host] [--size 1G] [--rounds 3]
                                   [--warm 10] [--device-workers on|off]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable

import numpy as np
from shm_transfer import in_process_pinned as pinned_copies

from accy import Client
from accy.testing import running_daemon

SIZES = {"64M": 64 << 20, "256M": 256 << 20, "1G": 1 << 30, "4G": 4 << 30}


def timed(nbytes: int, run: Callable[[], object]) -> float:
    """GB/s of one ``run`` moving ``nbytes``."""
    began = time.perf_counter()
    run()
    return nbytes / (time.perf_counter() - began) / 1e9


def in_process_pinned(nbytes: int, repeat: int = 3) -> dict[str, float]:
    """The best ``cuMemcpyHtoD`` / ``DtoH`` between ``cuMemHostAlloc`` memory and a buffer
    (``bench/shm_transfer.py``'s yardstick), as ``write`` and ``read``."""
    rows = pinned_copies(nbytes, repeat)
    return {way: rows[f"in-process pinned cuMemcpy {way}"] for way in ("write", "read")}


def shared_round(target: str, nbytes: int, data: np.ndarray, warm: int) -> dict[str, float]:
    """A fresh client and segment: first and second write and read, then the warm rate."""
    rows: dict[str, float] = {}
    with Client(target, client_name="first-transfer") as client:
        buffer = client.empty(data.size, np.float32)
        shared = client.shared_array(data.size, np.float32)  # a new segment, never locked
        shared[:] = data
        rows["first write"] = timed(nbytes, lambda: buffer.write(shared))
        shared[:] = 0
        rows["first read"] = timed(nbytes, lambda: buffer.read(out=shared))
        assert np.array_equal(shared, data), "the first round trip changed the data"
        rows["second write"] = timed(nbytes, lambda: buffer.write(shared))
        rows["second read"] = timed(nbytes, lambda: buffer.read(out=shared))
        for _ in range(warm):  # past 8 times its size: locked in the background
            buffer.write(shared)
            buffer.read(out=shared)
        time.sleep(2.0 * nbytes / (1 << 30))  # cuMemHostRegister: about 0.8 s per GiB
        rows["warm write"] = max(timed(nbytes, lambda: buffer.write(shared)) for _ in range(3))
        rows["warm read"] = max(timed(nbytes, lambda: buffer.read(out=shared)) for _ in range(3))
        assert np.array_equal(shared, data), "the warm round trips changed the data"
    return rows


def numpy_round(target: str, nbytes: int, data: np.ndarray) -> dict[str, float]:
    """A fresh client's ``client.buffer(array)`` and ``read()`` (one client-side copy more,
    through two pooled segments in pieces), the allocation timed apart; then the same
    client's second write and read (its segments mapped and faulted, perhaps locked)."""
    with Client(target, client_name="first-transfer-numpy") as client:
        began = time.perf_counter()
        buffer = client.empty(data.size, np.float32)
        allocated = time.perf_counter() - began
        pieces: list[float] = []
        write = timed(
            nbytes,
            lambda: buffer.write(data, progress=lambda *_: pieces.append(time.perf_counter())),
        )
        got: list[np.ndarray] = []
        read = timed(nbytes, lambda: got.append(buffer.read()))
        assert np.array_equal(got[0], data), "the numpy round trip changed the data"
        out = got.pop()
        second_write = timed(nbytes, lambda: buffer.write(data))
        second_read = timed(nbytes, lambda: buffer.read(out=out))
        assert np.array_equal(out, data), "the second numpy round trip changed the data"
    gaps = [round(1e3 * (b - a), 1) for a, b in itertools.pairwise(pieces)]
    print(f"  numpy: allocate {1e3 * allocated:.1f} ms; ms between pieces written: {gaps}")
    return {
        "numpy first write": write,
        "numpy first read": read,
        "numpy second write": second_write,
        "numpy second read (out=)": second_read,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["host", "cuda"], default="cuda")
    parser.add_argument("--size", choices=sorted(SIZES), default="1G")
    parser.add_argument("--rounds", type=int, default=3, help="fresh clients, each timed once")
    parser.add_argument("--warm", type=int, default=10, help="round trips before the warm rate")
    parser.add_argument("--device-workers", choices=["on", "off"], default="off")
    args = parser.parse_args()
    nbytes = SIZES[args.size]
    data = np.random.default_rng(1).standard_normal(nbytes // 4).astype(np.float32)
    baseline = in_process_pinned(nbytes) if args.backend == "cuda" else None
    workers = {"ACCYD_DEVICE_WORKERS": "1" if args.device_workers == "on" else "0"}
    rounds: list[dict[str, float]] = []
    with running_daemon(backend=args.backend, tcp=False, env=workers) as daemon:
        time.sleep(1.0)  # the staging slots are made in the background at start
        for index in range(args.rounds):
            rows = shared_round(daemon.unix_target, nbytes, data, args.warm)
            rows.update(numpy_round(daemon.unix_target, nbytes, data))
            rounds.append(rows)
            print(
                f"round {index}: " + ", ".join(f"{k} {v:.2f}" for k, v in rows.items()), flush=True
            )
    title = f"{args.backend}, {args.size}, device workers {args.device_workers}"
    print(f"\n| {title}: GB/s, median of {args.rounds} fresh clients | GB/s | of pinned |")
    print("|---|---:|---:|")
    if baseline is not None:
        for way, gbps in baseline.items():
            print(f"| in-process pinned cuMemcpy {way} (best of 3) | {gbps:.2f} | 1.00 |")
    for row in rounds[0]:
        median = statistics.median(r[row] for r in rounds)
        way = "read" if row.endswith("read") else "write"
        share = "" if baseline is None else f"{median / baseline[way]:.2f}"
        print(f"| {row} | {median:.2f} | {share} |")
    if baseline is not None:
        first = {
            way: statistics.median(r[f"first {way}"] for r in rounds) / baseline[way]
            for way in ("write", "read")
        }
        met = all(share >= 0.5 for share in first.values())
        print(
            f"\ngoal (first write and read >= 0.5 of pinned): {'met' if met else 'NOT met'} "
            f"(write {first['write']:.2f}, read {first['read']:.2f})"
        )


if __name__ == "__main__":
    main()
