"""Chaos on the host backend: frozen and killed clients, a busy daemon stopped, a successor.

Each round, on the daemon of the round before:

- a client stops (SIGSTOP) in the middle of a 256 MiB read, and a client with
  1,000 launches queued is killed (SIGKILL): everything both held is freed within
  their liveness plus 2 s of the stop;
- meanwhile a second daemon started on the same path is refused, and the first
  keeps serving;
- eight clients launch without pause;
- the busy daemon gets SIGTERM with a 2 s grace and is gone within the grace plus
  1 s; a successor started on the path once it stopped listening serves on after
  the old one exited, and is the next round's daemon.

With device workers (tests below): a device's worker stopped (SIGSTOP) is
declared lost within ``--worker-hang`` and replaced while the other device
serves on; SIGTERM to the daemon's whole process group during a launch drains
it (the workers leave on the front's word); a forked child is refused its
parent's Client, and the parent goes on.

Rounds: ``ACCY_CHAOS_ROUNDS`` (20 by default, about 10 s each on two cores).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from subprocess import PIPE, STDOUT
from typing import Any, NamedTuple

import grpc
import numpy as np
import pytest

from accy import Client, errors
from accy.protocol.launch.v1 import launch_pb2 as pb
from accy.protocol.launch.v1 import launch_pb2_grpc
from accy.testing import RunningDaemon, running_daemon, serving
from tests.survival.test_client_death import spawn, wait_ready, wait_until
from tests.survival.test_liveness import stopped
from tests.survival.victim import LIVENESS, Victim

pytestmark = pytest.mark.alone
"""Times its promptness under attack: runs in its own pytest process (scripts/test.sh)."""

ROUNDS = int(os.environ.get("ACCY_CHAOS_ROUNDS", "20"))
GRACE = 2.0
BUSY = 8
FREED_WITHIN = LIVENESS + 2.0
GONE_WITHIN = GRACE + 1.0
SLOW_CATALOG = Path(__file__).parents[1] / "catalogs" / "slow"
"""Where the flooding client's pipeline comes from: launches that sleep, so they stay queued."""


class Holdings(NamedTuple):
    clients: int
    sessions: int
    buffers: int
    memory: int


def holdings(target: str) -> Holdings:
    """What the daemon at ``target`` holds for all its clients (asked without attaching)."""
    with grpc.insecure_channel(target) as channel:
        stub = launch_pb2_grpc.LaunchServiceStub(channel)  # type: ignore[no-untyped-call]
        reply = stub.GetStatus(pb.GetStatusRequest(), timeout=5)
    return Holdings(reply.clients, reply.sessions, reply.buffers, reply.device_memory_in_use)


class Busy(Victim):
    """A client on a thread of the test that launches without pause until its daemon goes."""

    def __init__(self, target: str) -> None:
        self.launched = threading.Event()
        super().__init__(target)
        self.thread = threading.Thread(target=self._work, name="busy", daemon=True)
        self.thread.start()

    def keep_alive(self) -> None:
        with contextlib.suppress(grpc.RpcError, ValueError):
            super().keep_alive()

    def enqueue(self, session: str, x: str, y: str) -> str:
        launch_id = super().enqueue(session, x, y)
        self.launched.set()
        return launch_id

    def _work(self) -> None:
        with contextlib.suppress(grpc.RpcError, ValueError):
            self.run("launch")

    def close(self) -> None:
        self.thread.join(10)
        self.channel.close()


def freeze_and_kill(daemon: RunningDaemon) -> float:
    """Seconds from a client's freeze (and then another's kill) until both held nothing.

    Meanwhile (the daemon waits out the frozen client's liveness) a second daemon
    is started on the same path: it is refused, and the first serves on.
    """
    target = daemon.unix_target
    baseline = holdings(target)
    victims = [spawn("flood", target)]
    try:
        wait_ready(victims)  # its 1,000 launches are queued
        victims.append(spawn("freeze", target))
        wait_ready(victims[1:])
        flood, frozen = victims
        assert wait_until(functools.partial(stopped, frozen.pid), 5) is not None
        stopped_at = time.monotonic()
        assert holdings(target).clients == baseline.clients + 2
        os.kill(flood.pid, signal.SIGKILL)
        second = subprocess.Popen(
            daemon.command, env=daemon.env, stdout=PIPE, stderr=STDOUT, text=True
        )
        freed = wait_until(lambda: holdings(target) == baseline, FREED_WITHIN + 10, step=0.05)
        assert freed is not None, f"still held: {holdings(target)} vs {baseline}"
        took = time.monotonic() - stopped_at
        refused(second)
        assert serving(target), "the serving daemon stopped answering beside a refused one"
        return took
    finally:
        for victim in victims:
            victim.kill()
            victim.wait(10)
            victim.communicate()


def refused(second: subprocess.Popen[str]) -> None:
    """A second daemon on the served path exits by itself, naming the one that serves it."""
    output, _ = second.communicate(timeout=60)
    assert second.returncode != 0, output[-2000:]
    assert "another daemon serves" in output, output[-2000:]


def stop_busy(daemon: RunningDaemon) -> float:
    """SIGTERM the daemon while eight clients launch, start its successor; seconds it took to go."""
    target = daemon.unix_target
    socket_path = Path(target.removeprefix("unix:"))
    busy = [Busy(target) for _ in range(BUSY)]
    try:
        assert all(client.launched.wait(30) for client in busy)
        old = daemon.process
        gone: list[float] = []

        def wait_gone() -> None:
            old.wait()
            gone.append(time.monotonic())

        waiter = threading.Thread(target=wait_gone)
        waiter.start()
        old.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert wait_until(lambda: not socket_path.exists(), GONE_WITHIN) is not None
        daemon.start()  # the successor, on the same path, while the old one drains
        waiter.join(GONE_WITHIN + 10)
        assert gone, f"the stopped daemon is still there:\n{daemon.log_text()}"
        assert old.returncode >= 0, old.returncode  # it exited by itself
        assert serving(target), "the successor stopped answering when the old daemon exited"
        return gone[0] - signalled
    finally:
        for client in busy:
            client.close()


@pytest.mark.slow
def test_chaos_rounds_free_everything_in_time_and_a_daemon_always_serves() -> None:
    extra = ["--no-supervise", "--grace", str(GRACE), "--catalog", str(SLOW_CATALOG)]
    freed: list[float] = []
    gone: list[float] = []
    with running_daemon(backend="host", tcp=False, extra=extra) as daemon:
        for _ in range(ROUNDS):
            assert serving(daemon.unix_target)
            freed.append(freeze_and_kill(daemon))
            gone.append(stop_busy(daemon))
        assert holdings(daemon.unix_target).clients == 0
    print(
        f"\n{ROUNDS} rounds: frozen and killed clients freed within {max(freed):.2f} s "
        f"(bound {FREED_WITHIN} s), stopped daemons gone within {max(gone):.2f} s "
        f"(bound {GONE_WITHIN} s)"
    )
    assert max(freed) <= FREED_WITHIN, freed
    assert max(gone) <= GONE_WITHIN, gone


# -- device workers: one stopped, the whole group signalled; a forked client ---------------------

HANG = 1.5
"""``--worker-hang`` of the worker chaos: a stopped worker is declared lost this soon."""
SAXPY = "accy.kernel.saxpy"


def device_workers(daemon_pid: int, device: int) -> list[int]:
    """The pids of the worker processes (active and spare) serving ``device``, oldest first."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) != daemon_pid:
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if (
                b"accyd.backends.worker.child.main" in argv
                and argv[argv.index(b"--device") + 1] == str(device).encode()
            ):
                found.append((int(stat.rsplit(")", 1)[1].split()[19]), int(entry.name)))
    return [pid for _, pid in sorted(found)]


def saxpy_checked(client: Client, device: int, a: float) -> None:
    """A waited saxpy on ``device``, its result checked against numpy."""
    n = 4096
    x = np.arange(n, dtype=np.float32)
    with (
        client.load(SAXPY, device=device) as session,
        client.buffer(x, device=device) as xs,
        client.buffer(np.ones(n, np.float32), device=device) as ys,
    ):
        session.launch(operands=[xs, ys], results=[ys], n=n, a=a)
        np.testing.assert_allclose(ys.read(), a * x + 1)


def replaced(client: Client, replacements: int) -> bool:
    """Whether device 1 was replaced more often than ``replacements`` times."""
    return {d.index: d.replacements for d in client.status().devices}[1] > replacements


@pytest.mark.slow
def test_a_stopped_device_worker_is_replaced_in_time_and_the_other_device_serves_on() -> None:
    extra = ["--no-supervise", "--device", "0", "--device", "1", "--worker-hang", str(HANG)]
    with (
        running_daemon(backend="host", tcp=False, extra=extra) as daemon,
        Client(daemon.unix_target) as client,
    ):
        for round_ in range(3):
            saxpy_checked(client, 1, 2.0)  # device 1 serves before
            workers = device_workers(daemon.process.pid, 1)
            assert workers, "no worker serves device 1"
            before = {d.index: d.replacements for d in client.status().devices}
            os.kill(workers[0], signal.SIGSTOP)  # the active one: started first
            stopped = time.monotonic()
            for _ in range(20):  # device 0 is not held up meanwhile
                saxpy_checked(client, 0, 3.0)
            took = wait_until(functools.partial(replaced, client, before[1]), HANG + 10, step=0.05)
            assert took is not None, f"round {round_}: device 1 was never replaced"
            assert time.monotonic() - stopped < HANG + 5.0
            deadline = time.monotonic() + 10
            while True:  # its sessions and buffers were lost with it: a new load serves
                try:
                    saxpy_checked(client, 1, 4.0)
                    break
                except (errors.Unavailable, errors.DataLoss):
                    assert time.monotonic() < deadline, "device 1 never served again"
                    time.sleep(0.1)
            with contextlib.suppress(ProcessLookupError):
                os.kill(workers[0], signal.SIGCONT)


@pytest.mark.slow
def test_sigterm_to_the_whole_process_group_during_a_launch_drains_it() -> None:
    extra = [
        "--no-supervise",
        "--device-workers",
        "--grace",
        "10",
        "--catalog",
        str(SLOW_CATALOG),
    ]
    for _ in range(2):
        with running_daemon(backend="host", tcp=False, extra=extra) as daemon:
            with Client(daemon.unix_target) as client:
                session = client.load("accy.test.slow", version=1)
                x = client.buffer(np.full(16, 5, np.float32))
                y = client.empty(16, np.float32)
                launched = session.launch(operands=[x], results=[y], n=16, ms=2000, wait=False)
                time.sleep(0.5)
                code = daemon.kill(signal.SIGTERM)  # every process of the group, at once
                launched.wait()  # the drain finished it: no DEVICE_LOST
                logged = daemon.log_text()
            assert code == 0, logged
            assert "device worker faulted" not in logged, logged


def forked_launch(session: Any, x: Any, y: Any) -> str:
    """In a forked child: launch through the parent's Client; what happened, as a word."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read)
        signal.alarm(10)
        outcome = "ran"
        try:
            session.launch(operands=[x, y], results=[y], n=16, a=100.0)
        except errors.AccyError as error:
            outcome = f"refused: {error}"
        except BaseException as error:
            outcome = f"failed: {type(error).__name__}: {error}"
        os.write(write, outcome.encode()[:4000])
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read().decode()
    os.waitpid(pid, 0)
    return said


@pytest.mark.slow
def test_a_forked_child_is_refused_its_parents_client_and_the_parent_goes_on() -> None:
    with (
        running_daemon(backend="host", tcp=False) as daemon,
        Client(daemon.unix_target) as client,
        client.load(SAXPY) as session,
    ):
        x = client.buffer(np.full(16, 1, np.float32))
        y = client.buffer(np.full(16, 1, np.float32))
        session.launch(operands=[x, y], results=[y], n=16, a=1.0)  # the ring is open
        said = forked_launch(session, x, y)
        assert said.startswith("refused") and "fork" in said, said
        for a in (2.0, 5.0):  # the parent's launches run and compute, as before
            y.write(np.full(16, 1, np.float32))
            session.launch(operands=[x, y], results=[y], n=16, a=a)
            np.testing.assert_allclose(y.read(), a + 1)
