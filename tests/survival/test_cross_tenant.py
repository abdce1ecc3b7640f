"""Nothing one tenant does slows, blocks or reaches another (host backend, TCP with tokens).

Tenant A, within its quotas, runs every attack of ``attacker.py`` at once for
``ACCY_ATTACK_SECONDS`` (30 s): copies waiting on long kernels, tiny untaken
segments, as many clients and rings as it may have, refused-record floods, a
slowloris on the handoff socket, and (in the second test) RingStream frames
of refused and valid records, and (in the third) the KServe door's attacks.
Meanwhile tenant B, over TCP, attaches, loads, allocates, writes, launches and
reads again and again (and, in the third, infers through the KServe door): 99% of
its calls must answer within ``PROMPT`` seconds and all within ``WORST``, with checked
results. The daemon's descriptors, resident memory and log stay within ``*_BOUND``
throughout, and descriptors and every tenant's usage are back to the baseline after.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import numpy as np
import pytest

from accy import Client
from accy.protocol.launch.v1 import launch_pb2 as pb
from accy.protocol.launch.v1 import launch_pb2_grpc
from accy.testing import RunningDaemon, running_daemon
from accyd.doors.kserve.protocol import open_inference_pb2 as kpb
from tests.security.harness import TokenSpec, write_tokens
from tests.survival.attacker import kserve_stub, saxpy_request

pytestmark = pytest.mark.alone
"""Times its promptness under attack: runs in its own pytest process (scripts/test.sh)."""

SECONDS = float(os.environ.get("ACCY_ATTACK_SECONDS", "30"))
PROMPT = 0.5
"""Seconds within which 99% of tenant B's calls must answer (``check_prompt``)."""
WORST = 1.0
"""Seconds within which every one of tenant B's calls must answer.

The rare call past ``PROMPT`` was B's own process waiting for a CPU, not the daemon: a
profile of B's slowest launches under the attack with a busy loop beside it found the
time inside B, in starting the ring stream's thread (0.20 s) and in mapping its ring
memory (``Ring.__init__``: ``fstat``, ``mmap``, the header's first read; 0.30 s). CI
(two CPUs) once saw one launch of ~1,300 take 0.68 s. Before tenant turns, A's
concurrency delayed every call of B's 30-100x."""
MiB = 1 << 20
QUOTAS = {
    "memory_bytes": 512 * MiB,
    "sessions": 64,
    "buffers": 2048,
    "launches_in_flight": 20000,
    "clients": 48,
    "descriptors": 400,
    "host_memory_bytes": 128 * MiB,
}
"""Tenant A's quotas: it stays within them (every refusal it meets is one of them)."""
DESCRIPTORS_BOUND = QUOTAS["descriptors"] + 128 + 200
"""Over the baseline: A's descriptors, the handoff's waiting connections of one user, and
connections and streams."""
HOST_MEMORY_LIMIT = 1024 * MiB
"""The daemon's ``--host-memory-limit``: its KServe door holds a quarter of it at most."""
RSS_BOUND = HOST_MEMORY_LIMIT
"""Over the baseline: the buffers' limit is the margin (the door's quarter inside it)."""
KSERVE_WORST = 2.0
"""``WORST`` under tenant A's KServe attack at full speed on two CPUs: one of tenant B's
~5,000 calls in a run may take up to about 1.1 s (a load, an attach). Before the door's
tenant turns, A's concurrency delayed B 30-100x."""
KSERVE_RSS_BOUND = HOST_MEMORY_LIMIT + 768 * MiB
"""The KServe attack's peak: the door's count bounds what requests hold until their answers
are handed to gRPC, but gRPC keeps the answers of A's 8 streams that never read them (up to
64 MiB each, 512 MiB) and the requests it has received and not yet handed over outside it;
the peaks measured were 0.6-1.54 GB. Open: count what gRPC holds."""
LOG_BOUND = 16 * MiB
"""How much the daemon's log may grow over the whole attack."""
ATTACKER_NICENESS = 10
"""Tenant A's client processes run at this niceness. They share this machine's two CPUs
with the daemon and with B, which a node would not let them do: their containers get a CPU
share of their own (Kubernetes requests and limits), and remote clients spend none of the
node's. Niceness stands in for that share, so what is timed is what the daemon does with A's
requests, not how the kernel schedules A's Python. At niceness 0 the attack is no stronger
(the daemon took 40,960 refused stream records in 30 s, against 57,344 niced), but one of
B's calls in CI (2 CPUs) once waited 0.68 s for a CPU, and locally with two busy loops beside
it 0.49 s; niced, with the same busy loops, 0.10 s."""
SLOW_CATALOG = Path(__file__).parents[1] / "catalogs" / "slow"
ATTACKER = Path(__file__).with_name("attacker.py")
SAXPY = "accy.kernel.saxpy"
_T = TypeVar("_T")


def daemon_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def daemon_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Watch:
    """Samples the daemon's descriptors, memory and log size on a thread of its own."""

    def __init__(self, daemon: RunningDaemon) -> None:
        self.pid = daemon.process.pid
        self.log = daemon.log
        self.most = {"fds": 0, "rss": 0, "log": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            for key, value in (
                ("fds", daemon_fds(self.pid)),
                ("rss", daemon_rss(self.pid)),
                ("log", self.log.stat().st_size),
            ):
                self.most[key] = max(self.most[key], value)

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join(5)
        return self.most


def notable(daemon: RunningDaemon) -> str:
    """The daemon's log lines that say something went wrong, not tenant A's refusals (which
    are the attack), the last of them."""
    words = ("[warning", "[error", "[critical", "closed", "broke", "Traceback")
    lines = daemon.log.read_text(errors="replace").splitlines()
    picked = [line for line in lines if any(w in line for w in words) and "team-a" not in line]
    return "\n".join(picked)[-6000:]


def tenants(target: str, token: str) -> dict[str, pb.TenantStatus]:
    with grpc.insecure_channel(target) as channel:
        stub = launch_pb2_grpc.LaunchServiceStub(channel)  # type: ignore[no-untyped-call]
        reply = stub.GetStatus(
            pb.GetStatusRequest(), metadata=(("authorization", f"Bearer {token}"),), timeout=5
        )
    return {tenant.name: tenant for tenant in reply.tenants}


def held(tenant: pb.TenantStatus | None) -> tuple[int, ...]:
    if tenant is None:
        return (0, 0, 0, 0, 0)
    return (
        tenant.clients,
        tenant.sessions,
        tenant.buffers,
        tenant.memory_bytes,
        tenant.launches_in_flight,
    )


def timed(calls: list[tuple[str, float]], name: str, call: Callable[[], _T]) -> _T:
    started = time.perf_counter()
    result = call()
    calls.append((name, time.perf_counter() - started))
    return result


def victim_round(target: str, token: str, rng: np.random.Generator) -> list[tuple[str, float]]:
    """Tenant B's calls, each timed, the result checked."""
    calls: list[tuple[str, float]] = []
    n = 1 << 14
    x = rng.standard_normal(n).astype(np.float32)
    a = float(rng.uniform(-2, 2))
    client = timed(calls, "attach", lambda: Client(target, token=token, client_name="victim"))
    with client:
        session = timed(calls, "load", lambda: client.load(SAXPY))
        xs = timed(calls, "allocate", lambda: client.empty(n, np.float32))
        ys = timed(calls, "allocate", lambda: client.empty(n, np.float32))
        timed(calls, "write", lambda: xs.write(x))
        timed(calls, "write", lambda: ys.write(np.ones(n, np.float32)))
        timed(calls, "launch", lambda: session.launch(operands=[xs, ys], results=[ys], n=n, a=a))
        got = timed(calls, "read", ys.read)
        np.testing.assert_allclose(got, np.float32(a) * x + 1, rtol=1e-5, atol=1e-5)
    return calls


def kserve_round(target: str, token: str, rng: np.random.Generator) -> list[tuple[str, float]]:
    """Tenant B's accy calls, then a ModelInfer of saxpy through the KServe door, checked."""
    calls = victim_round(target, token, rng)
    n = int(rng.integers(1, 4096))
    channel, stub = kserve_stub(target)
    with channel:
        auth = (("authorization", f"Bearer {token}"),)
        request = saxpy_request(n)
        answer: kpb.ModelInferResponse = timed(
            calls, "ModelInfer", lambda: stub.ModelInfer(request, metadata=auth, timeout=10)
        )
    assert np.all(np.frombuffer(answer.raw_output_contents[0], np.float32) == 3.0)
    return calls


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[RunningDaemon, dict[str, str]]]:
    specs = {
        "a": TokenSpec("team-a", quotas=QUOTAS),
        "b": TokenSpec("team-b"),
        "ops": TokenSpec("ops", scopes=("admin",)),
    }
    tokens = write_tokens(tmp_path / "tokens.toml", specs)
    extra = ["--no-supervise", "--tokens", str(tmp_path / "tokens.toml")]
    extra += ["--host-memory-limit", str(HOST_MEMORY_LIMIT)]
    extra += ["--catalog", str(SLOW_CATALOG)]
    with running_daemon(backend="host", extra=extra) as daemon:
        yield daemon, tokens


def under_attack(
    daemon: RunningDaemon,
    tokens: dict[str, str],
    modes: list[str],
    victim: Callable[[str, str, np.random.Generator], list[tuple[str, float]]] = victim_round,
) -> tuple[list[tuple[str, float]], dict[str, int], list[dict[str, Any]]]:
    """Run the attacks of ``modes`` and tenant B's rounds together; B's calls, the daemon's
    peaks over the baseline, and each attacker's counts. Checks the return to the baseline."""
    assert daemon.tcp_target is not None
    unix, tcp = daemon.unix_target, daemon.tcp_target
    pid = daemon.process.pid
    rng = np.random.default_rng(23)
    victim(tcp, tokens["b"], rng)  # warm: the pipeline compiled, the pools made
    time.sleep(0.5)
    baseline = {"fds": daemon_fds(pid), "rss": daemon_rss(pid), "log": daemon.log.stat().st_size}
    before = {name: held(t) for name, t in tenants(tcp, tokens["ops"]).items()}
    niced = ["nice", "-n", str(ATTACKER_NICENESS)]
    attackers = [
        subprocess.Popen(
            [*niced, sys.executable, str(ATTACKER), mode, unix, tcp, tokens["a"], str(SECONDS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for mode in modes
    ]
    watch = Watch(daemon)
    calls: list[tuple[str, float]] = []
    try:
        time.sleep(2.0)  # every attack under way
        stop = time.monotonic() + SECONDS - 4.0
        while time.monotonic() < stop:
            try:
                calls += victim(tcp, tokens["b"], rng)
            except Exception as error:
                raise AssertionError(f"tenant B failed: {error}\n{notable(daemon)}") from error
    finally:
        counts = []
        for attacker in attackers:
            out, err = attacker.communicate(timeout=SECONDS + 60)
            assert attacker.returncode == 0, err[-3000:]
            counts.append(json.loads(out.strip().splitlines()[-1]))
    most = watch.stop()
    peaks = {key: most[key] - baseline[key] for key in most}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        now = tenants(tcp, tokens["ops"])
        back = daemon_fds(pid) <= baseline["fds"] + 8 and held(now.get("team-a")) == (0,) * 5
        if back and held(now.get("team-b")) == before.get("team-b", (0,) * 5):
            break
        time.sleep(0.2)
    assert daemon_fds(pid) <= baseline["fds"] + 8, (daemon_fds(pid), baseline)
    assert held(now.get("team-a")) == (0,) * 5, now.get("team-a")
    assert daemon.process.poll() is None, daemon.log_text()
    return calls, peaks, counts


def check_bounds(
    peaks: dict[str, int], counts: list[dict[str, Any]], rss_bound: int = RSS_BOUND
) -> None:
    assert peaks["fds"] <= DESCRIPTORS_BOUND, peaks
    assert peaks["rss"] <= rss_bound, peaks
    assert peaks["log"] <= LOG_BOUND, peaks
    done = {key for count in counts for key, value in count.items() if key != "mode" and value}
    assert any(key.startswith("refused") for key in done), counts  # A met its limits


def check_prompt(calls: list[tuple[str, float]], worst: float = WORST) -> None:
    """99% of B's calls within ``PROMPT``, and every one within ``worst``."""
    late = [(name, round(seconds, 3)) for name, seconds in calls if seconds > PROMPT]
    assert len(late) <= len(calls) // 100, f"tenant B's calls past {PROMPT} s: {late}"
    assert max(s for _, s in calls) <= worst, f"tenant B's slowest calls: {late}"


@pytest.mark.slow
def test_a_tenant_within_its_quotas_slows_no_other_tenant(
    served: tuple[RunningDaemon, dict[str, str]],
) -> None:
    daemon, tokens = served
    modes = ["copies", "segments", "clients", "flood", "slowloris"]
    calls, peaks, counts = under_attack(daemon, tokens, modes)
    print(
        f"\n{len(calls)} calls of tenant B, the slowest {max(s for _, s in calls):.3f} s; "
        f"daemon peaks over the baseline {peaks}; attackers {counts}"
    )
    assert len(calls) >= 8 * 10, "tenant B made too few rounds"
    check_prompt(calls)
    check_bounds(peaks, counts)


@pytest.mark.slow
def test_ring_stream_frames_of_a_tenant_slow_no_other_tenant(
    served: tuple[RunningDaemon, dict[str, str]],
) -> None:
    """With every attack, RingStream frames of refused and valid records too."""
    daemon, tokens = served
    modes = ["copies", "segments", "clients", "flood", "slowloris", "streams"]
    calls, peaks, counts = under_attack(daemon, tokens, modes)
    print(
        f"\n{len(calls)} calls of tenant B, the slowest {max(s for _, s in calls):.3f} s; "
        f"daemon peaks over the baseline {peaks}; attackers {counts}"
    )
    check_prompt(calls)
    check_bounds(peaks, counts)


@pytest.mark.slow
def test_kserve_callers_of_a_tenant_slow_no_other_tenant(
    served: tuple[RunningDaemon, dict[str, str]],
) -> None:
    """Many-dim shapes, 32 streams of 16 requests, never-read streams, huge requests and
    listings from tenant A; tenant B's accy calls and ModelInfers stay prompt, the daemon's
    memory within its limit, and all comes back after."""
    daemon, tokens = served
    calls, peaks, counts = under_attack(daemon, tokens, ["kserve"], victim=kserve_round)
    print(
        f"\n{len(calls)} calls of tenant B, the slowest {max(s for _, s in calls):.3f} s; "
        f"daemon peaks over the baseline {peaks}; attackers {counts}"
    )
    check_prompt(calls, KSERVE_WORST)
    assert not counts[0].get("kserve many-dim requests served"), counts
    assert counts[0].get("kserve stream answers", 0) > 0, counts  # A was served meanwhile
    check_bounds(peaks, counts, KSERVE_RSS_BOUND)
