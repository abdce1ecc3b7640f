"""Two installed trees of accy, the same client series against each, interleaved: A/B.

For a restructuring that should change nothing: each tree is installed in a folder of
its own (``pip install --target``, its native engine built), and every round starts each
tree's daemon in turn (``accyd serve --catalog bench/catalog`` on the CUDA backend) and
runs the same client processes against it, the client of that tree importing from that
folder. The clients are the sharing benchmark's workers (this tree's bench/), which use
only the public client API that both trees share. Series: the same-host waited round trip
(tiny kernel), one client's rate with ``wait=False`` (short kernel), and 8 clients each
waiting for every launch (short kernel). Kernels are not calibrated: both trees run the
same iteration counts.

    python bench/ab_trees.py --tree before=/tmp/site-before --tree after=/tmp/site-after \
        [--rounds 3] [--seconds 1.0]

Prints each series' median over rounds for each tree, and the ratio of the last tree to
the first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from _sharing_workers import Spec, run_workers
from bench_sharing import CATALOG, UNCALIBRATED_ITERS

from accy.testing import running_daemon


def series(target: str, env: dict[str, str], args: argparse.Namespace) -> dict[str, float]:
    timeout = args.seconds * 4 + 90
    rtt: Spec = {
        "kind": "accy-rtt",
        "target": target,
        "iters": UNCALIBRATED_ITERS["tiny"],
        "iterations": args.iterations,
    }
    one: Spec = {
        "kind": "accy-rate",
        "index": 0,
        "target": target,
        "iters": UNCALIBRATED_ITERS["short"],
        "seconds": args.seconds,
    }
    eight: list[Spec] = [one | {"index": i, "waited": True} for i in range(args.clients)]
    round_trip = run_workers([rtt], env=env, run_timeout=timeout)[0]
    rate = run_workers([one], env=env, run_timeout=timeout)[0]
    crowd = run_workers(eight, env=env, run_timeout=timeout)
    return {
        "round trip p50 µs": round_trip["launch"]["p50_us"],
        "one client k/s": rate["per_second"],
        f"{args.clients} waited k/s": sum(r["per_second"] for r in crowd),
        f"{args.clients} waited p50 µs": statistics.median(r["latency"]["p50_us"] for r in crowd),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, help="NAME=FOLDER")
    parser.add_argument(
        "--variant",
        nargs=3,
        action="append",
        default=[],
        metavar=("NAME", "TREE", "FLAGS"),
        help="one more series set: TREE's daemon with FLAGS (K=V words set its environment)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    folders = dict(tree.split("=", 1) for tree in args.tree)
    trees = {name: (folder, "") for name, folder in folders.items()}
    trees |= {name: (folders[tree], flags) for name, tree, flags in args.variant}
    found: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    here = str(Path(__file__).parent)
    for number in range(args.rounds):
        for name, (folder, flags) in trees.items():
            env = dict(os.environ, PYTHONPATH=f"{folder}:{here}")
            words = flags.split()
            daemon_env = env | dict(w.split("=", 1) for w in words if "=" in w)
            extra = ["--catalog", str(CATALOG), *(w for w in words if "=" not in w)]
            with running_daemon(
                backend=args.backend, tcp=False, extra=extra, env=daemon_env
            ) as daemon:
                got = series(daemon.unix_target, env, args)
            print(f"round {number + 1} {name}: {got}", flush=True)
            found[name].append(got)
    names = list(trees)
    first, last = names[0], names[len(folders) - 1]
    print(f"\n{'series (median of rounds)':<26}" + "".join(f"{n:>12}" for n in names)
          + f"{last + '/' + first:>16}")  # fmt: skip
    for key in found[first][0]:
        medians = {n: statistics.median(r[key] for r in found[n]) for n in names}
        ratio = medians[last] / medians[first]
        print(f"{key:<26}" + "".join(f"{medians[n]:>12,.1f}" for n in names) + f"{ratio:>16.3f}")
    if args.out is not None:
        args.out.write_text(json.dumps(found, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
