"""What the core's bound launch (``Daemon.launch_bound``) costs the ring's submitter, by step.

Run from the repository root (no GPU needed):

    python bench/ring_core_cost.py [--backend recording|host|cuda] [--count 20000]

It binds one saxpy launch on three one-element buffers (as a ring record does),
then replays it ``--count`` times with ``count=1`` and in runs of 16 (the least
of ``--repeat`` rounds, by step), and times each step of ``launch_bound`` by
wrapping the functions it calls (the wrappers add about 0.2 µs each, so the
steps sum to a little more than the whole). The
ring's own work per batch (``newest_launch``, ``frees_of``, ``touch``) is timed
the same way. Nothing in the core is changed.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import defaultdict
from typing import Any

import structlog

from accy._table import markdown
from accyd.catalog import load_catalog
from accyd.catalog.dtypes import DType, Scalar
from accyd.core import accounting, launching, sessions
from accyd.core.daemon import Daemon
from accyd.core.prepared import PreparedLaunches

SAXPY = "accy.kernel.saxpy"

_spent: dict[str, int] = defaultdict(int)


def _timed(owner: Any, name: str, label: str) -> None:
    """Wrap ``owner.name`` so its time adds up under ``label``."""
    original = getattr(owner, name)
    clock = time.perf_counter_ns

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = clock()
        try:
            return original(*args, **kwargs)
        finally:
            _spent[label] += clock() - started

    setattr(owner, name, wrapper)


def _backend(name: str) -> Any:
    if name == "recording":
        from accyd.testing.recording import RecordingBackend

        return RecordingBackend()
    from accyd.backends.select import make_backend

    return make_backend(name)


def measure(daemon: Daemon, client: str, session: str, run: int, count: int) -> dict[str, float]:
    """µs per ``launch_bound`` call, by step, replaying runs of ``run`` launches."""
    x, y, z = (daemon.allocate_buffer(client, 4, DType.F32).id for _ in range(3))
    scalars = {"n": Scalar.u32(1), "a": Scalar.f32(1.0)}
    bound = daemon.bind_launch(client, session, [x, y], [z], scalars)
    assert bound is not None
    calls = max(count // run, 1)
    for _ in range(200):
        daemon.launch_bound(bound, run)
    daemon.wait_launch(client, session)
    _spent.clear()
    clock = time.perf_counter_ns
    total = 0
    for index in range(calls):
        started = clock()
        assert daemon.launch_bound(bound, run)
        watch = daemon.newest_launch(client, session)  # what the ring does once per batch
        daemon.frees_of(client)
        daemon.touch(client)
        total += clock() - started
        if watch is not None:
            watch.close()
        if index % 64 == 63:
            daemon.wait_launch(client, session)
    daemon.wait_launch(client, session)
    out = {label: spent / calls / 1e3 for label, spent in _spent.items()}
    out["whole (launch_bound + the ring's per-batch calls)"] = total / calls / 1e3
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="recording")
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=3, help="the least of this many, by step")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    daemon = Daemon(load_catalog(), {0: _backend(args.backend)})
    client = daemon.attach("core-cost").id
    session = daemon.load_pipeline(client, SAXPY).session_id
    steps: list[tuple[Any, str, str]] = [
        (Daemon, "launch_bound", "launch_bound"),
        (Daemon, "newest_launch", "ring: newest_launch"),
        (Daemon, "frees_of", "ring: frees_of"),
        (Daemon, "touch", "ring: touch"),
        (daemon._state, "check_serving", "  check_serving"),
        (sessions.Session, "reap", "  session.reap"),
        (daemon._ledger, "reserve", "  ledger.reserve"),
        (accounting.Reservation, "__exit__", "  reservation exit"),
        (launching.Launching, "_replay", "  _replay"),
        (launching, "hazards", "    hazards"),
        (launching, "order_after", "    order_after"),
        (sessions.Session, "prepared_for", "    session.prepared_for (once per generation)"),
        (PreparedLaunches, "get", "      prepared.get (key + lookup)"),
        (sessions.Session, "replay", "    session.replay"),
        (sessions.Session, "_push", "      _push (Mark: record_event)"),
        (launching, "note", "    note (marks on buffers)"),
    ]
    for owner, name, label in steps:
        _timed(owner, name, label)
    columns: dict[int, dict[str, float]] = {}
    for _ in range(args.repeat):  # interleaved, the least of each: what the step costs unloaded
        for run in (1, 16):
            found = measure(daemon, client, session, run, args.count)
            kept = columns.setdefault(run, found)
            for label, value in found.items():
                kept[label] = min(kept.get(label, value), value)
    labels = [label for _, _, label in steps] + [
        "whole (launch_bound + the ring's per-batch calls)"
    ]
    rows = [
        [label, *(f"{columns[run].get(label, 0.0):.2f}" for run in columns)] for label in labels
    ]
    daemon.close()
    print(f"launch_bound by step, {args.backend} backend, saxpy n=1, µs per call", end="")
    print(f" (least of {args.repeat})")
    print(markdown(["step", "run of 1", "run of 16"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
