"""What a device worker costs: per-launch overhead through ``WorkerBackend``, round trips, replace.

The same one-stage launch (a kernel that does nothing, one buffer, one
scalar) on one stream, each followed by ``record_event`` and ``destroy_event``
as the daemon's launch path does (a mark per launch), timed:

- on the backend in this process (``--backend host``: ``HostBackend``; ``cuda``:
  ``CudaBackend``), and through a worker (``WorkerBackend``) of the same kind;
- as plain launches and as prepared replays (``Backend.prepare``);
- *caller*: the time the calling thread spends per launch (what the daemon's
  submitting thread pays); *drained*: including a synchronize at the end;
  *worker paused*: the caller's time with the worker stopped (SIGSTOP), the
  front's own cost without the worker competing for a small machine's CPUs.

Then the round trips (``event_done`` of an event not yet known done, and
``synchronize`` of an idle stream), a worker's cold start, and
``DevicePool.replace`` with a ready spare. Medians of ``--repeat`` runs.

Last, copies with host-shared memory (a sealed memfd mapped whole, as a
daemon's segment): a ``--copy-mib`` write and read of one buffer, in MB/s
(best of ``--repeat``), in-process and through a worker, the worker's both
ways: the *bytes path* (pinned without the descriptor: the bytes cross the
channel) and the *shared path* (``pin_host(view, fd)``: the worker maps the
same pages and the channel carries an op). ``--copies-only`` runs only these.

    python bench/worker_overhead.py [--backend host|cuda] [--launches N] [--repeat N]
                                    [--copy-mib N] [--copies-only] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import mmap
import os
import signal
import statistics
import time
from collections.abc import Callable

from accyd.backends.base import ArtifactRequest, Backend, LaunchRequest
from accyd.backends.select import make_backend
from accyd.backends.worker.front.pool import DevicePool
from accyd.backends.worker.front.proxy import WorkerBackend
from accyd.catalog import ArtifactFormat, Scalar
from accyd.catalog.model import FixedGeometry

HOST_SOURCE = "def noop(grid, block, buffers, scalars):\n    pass\n"
CUDA_SOURCE = 'extern "C" __global__ void noop(float* out, unsigned int n) {}\n'


def _request(backend: Backend, kind: str) -> tuple[LaunchRequest, Callable[[], None]]:
    """A one-stage launch on a fresh stream, and what frees it all."""
    fmt = ArtifactFormat.HOST_PY if kind == "host" else ArtifactFormat.CUDA_CPP
    source = HOST_SOURCE if kind == "host" else CUDA_SOURCE
    artifact = backend.create_artifact(ArtifactRequest("noop", fmt, 2, 1, source, origin="bench"))
    loaded = backend.load_artifact(artifact)
    artifact.close()
    buffer = backend.allocate_buffer(4096)
    stream = backend.create_stream()
    geometry = FixedGeometry((1, 1, 1), (32, 1, 1))
    request = LaunchRequest(artifact, loaded, [buffer], [Scalar.u32(1024)], geometry, stream)

    def free() -> None:
        backend.synchronize(stream)
        backend.destroy(buffer)
        backend.destroy(loaded)
        backend.destroy_stream(stream)

    return request, free


def per_launch(backend: Backend, kind: str, launches: int, prepared: bool) -> tuple[float, float]:
    """(caller µs, drained µs) per launch, one run."""
    request, free = _request(backend, kind)
    stream = request.stream
    replay = backend.prepare([request]) if prepared else None
    launch: Callable[[], None] = (
        (lambda: replay.launch(stream)) if replay is not None else (lambda: backend.launch(request))
    )
    for _ in range(200):  # warm up
        launch()
        backend.destroy_event(backend.record_event(stream))
    backend.synchronize(stream)
    started = time.perf_counter()
    for _ in range(launches):
        launch()
        backend.destroy_event(backend.record_event(stream))
    caller = time.perf_counter() - started
    backend.synchronize(stream)
    drained = time.perf_counter() - started
    if replay is not None:
        replay.close()
    free()
    return caller / launches * 1e6, drained / launches * 1e6


def front_only(worker: WorkerBackend, kind: str, launches: int = 100) -> float:
    """µs per launch the calling thread pays with the worker paused (SIGSTOP): the front's own
    cost, without the worker competing for the CPU (``launches`` frames must fit the socket)."""
    request, free = _request(worker, kind)
    stream = request.stream
    os.kill(worker.pid, signal.SIGSTOP)
    try:
        started = time.perf_counter()
        for _ in range(launches):
            worker.launch(request)
            worker.destroy_event(worker.record_event(stream))
        took = time.perf_counter() - started
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    free()
    return took / launches * 1e6


def round_trips(backend: Backend, count: int) -> tuple[float, float]:
    """(event_done µs, synchronize of an idle stream µs), medians."""
    stream = backend.create_stream()
    done, sync = [], []
    for _ in range(count):
        event = backend.record_event(stream)
        started = time.perf_counter()
        backend.event_done(event)
        done.append(time.perf_counter() - started)
        started = time.perf_counter()
        backend.synchronize(stream)
        sync.append(time.perf_counter() - started)
        backend.destroy_event(event)
    backend.destroy_stream(stream)
    return statistics.median(done) * 1e6, statistics.median(sync) * 1e6


def replace_ms(kind: str, repeat: int) -> tuple[float, float]:
    """(cold start ms, replace-with-a-ready-spare ms), medians."""
    starts, swaps = [], []
    for _ in range(repeat):
        started = time.perf_counter()
        WorkerBackend(kind, 0).close()
        starts.append(time.perf_counter() - started)
    pool = DevicePool(kind, [0])
    try:
        for _ in range(repeat):
            if not pool.wait_for_spares(120):
                raise RuntimeError("the spare did not start")
            started = time.perf_counter()
            pool.replace(0)
            swaps.append(time.perf_counter() - started)
    finally:
        pool.close()
    return statistics.median(starts) * 1e3, statistics.median(swaps) * 1e3


def copy_rates(backend: Backend, nbytes: int, repeat: int, *, with_fd: bool) -> tuple[float, float]:
    """(write MB/s, read MB/s), best of ``repeat``: one buffer, from and into a memfd mapping
    pinned with ``pin_host`` (given the memfd when ``with_fd``)."""
    fd = os.memfd_create("accy-bench-segment", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, 2 * nbytes)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    mapping = mmap.mmap(fd, 2 * nbytes)
    view = memoryview(mapping)
    view[:nbytes] = os.urandom(1 << 20) * (nbytes >> 20)
    pinned = backend.pin_host(view, fd) if with_fd else backend.pin_host(view)
    buffer = backend.allocate_buffer(nbytes)
    source, target = view[:nbytes], view[nbytes:]
    writes, reads = [], []
    try:
        for _ in range(repeat):
            started = time.perf_counter()
            backend.write(buffer, 0, source, None)
            writes.append(time.perf_counter() - started)
            started = time.perf_counter()
            backend.read_into(buffer, 0, target, None)
            reads.append(time.perf_counter() - started)
        if source != target:
            raise RuntimeError("the copies changed the data")
    finally:
        backend.destroy(buffer)
        backend.unpin_host(pinned)
        source.release()
        target.release()
        with contextlib.suppress(BufferError):  # the CUDA backend may still export it: the
            view.release()  # mapping then goes with its last user, as a segment's does
            mapping.close()
        os.close(fd)
    return nbytes / min(writes) / 1e6, nbytes / min(reads) / 1e6


def copies(kind: str, mib: int, repeat: int) -> dict[str, float]:
    nbytes = mib << 20
    results: dict[str, float] = {}
    direct = make_backend(kind)
    worker = WorkerBackend(kind, 0, log_level="warning")
    try:
        for label, backend, with_fd in (
            ("in-process", direct, True),
            ("worker, bytes path", worker, False),
            ("worker, shared path", worker, True),
        ):
            write, read = copy_rates(backend, nbytes, repeat, with_fd=with_fd)
            results[f"{label}: {mib} MiB write MB/s"] = write
            results[f"{label}: {mib} MiB read MB/s"] = read
    finally:
        worker.close()
        direct.close()
    return results


def launches_and_round_trips(args: argparse.Namespace, results: dict[str, float]) -> None:
    direct = make_backend(args.backend)
    worker = WorkerBackend(args.backend, 0, log_level="warning")
    try:
        for name, backend in (("in-process", direct), ("worker", worker)):
            for prepared in (False, True):
                runs = [
                    per_launch(backend, args.backend, args.launches, prepared)
                    for _ in range(args.repeat)
                ]
                label = f"{name} {'replay' if prepared else 'launch'}"
                results[f"{label}: caller us/launch"] = statistics.median(r[0] for r in runs)
                results[f"{label}: drained us/launch"] = statistics.median(r[1] for r in runs)
            if isinstance(backend, WorkerBackend):
                results["worker launch: caller us/launch, worker paused"] = statistics.median(
                    front_only(backend, args.backend) for _ in range(args.repeat)
                )
            done, sync = round_trips(backend, 500)
            results[f"{name}: event_done us"] = done
            results[f"{name}: synchronize idle stream us"] = sync
    finally:
        worker.close()
        direct.close()
    cold, swap = replace_ms(args.backend, args.repeat)
    results["worker cold start ms"] = cold
    results["DevicePool.replace with a ready spare ms"] = swap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["host", "cuda"], default="host")
    parser.add_argument("--launches", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--copy-mib", type=int, default=64, help="the copies' size, MiB")
    parser.add_argument("--copies-only", action="store_true", help="time the copies only")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args()
    results: dict[str, float] = {}
    if not args.copies_only:
        launches_and_round_trips(args, results)
    results.update(copies(args.backend, args.copy_mib, args.repeat))
    width = max(len(key) for key in results)
    print(
        f"backend {args.backend}: launches {args.launches} x {args.repeat} runs (medians), "
        f"copies best of {args.repeat}"
    )
    for key, value in results.items():
        print(f"  {key:<{width}}  {value:10.2f}")
    if args.json:
        print(json.dumps({"backend": args.backend, **results}))


if __name__ == "__main__":
    main()
