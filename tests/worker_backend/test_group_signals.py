"""Signals to the daemon's whole process group: device workers leave on the front's word only."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import grpc
import numpy as np

from accy.protocol.launch.v1 import launch_pb2 as pb
from accy.testing import running_daemon
from tests.launch_service.harness import attach, chunks

SLOW_CATALOG = Path(__file__).parents[1] / "catalogs" / "slow"
SLOW = "accy.test.slow"


def test_sigterm_to_the_process_group_lets_the_drain_finish_a_launch_on_a_worker() -> None:
    """systemd's default kill mode (and ``timeout``) signals every process of the unit:
    the workers must not die under a drain that still waits for their launches."""
    extra = ["--no-supervise", "--device-workers", "--grace", "10", "--catalog", str(SLOW_CATALOG)]
    with running_daemon(backend="host", tcp=False, extra=extra) as daemon:
        with grpc.insecure_channel(daemon.unix_target) as channel:
            client = attach(channel)
            session = client.LoadPipeline(pb.LoadPipelineRequest(target=SLOW, version=1))
            x, y = (
                client.AllocateBuffer(pb.AllocateBufferRequest(byte_size=64, dtype=pb.DTYPE_F32))
                for _ in range(2)
            )
            client.WriteBuffer(chunks(x.buffer_id, np.full(16, 7, np.float32).tobytes(), 64))
            scalars = {"n": pb.Scalar(u32=16), "ms": pb.Scalar(u32=2500)}
            waited = client.stub.Launch.future(
                pb.LaunchRequest(
                    session_id=session.session_id,
                    operands=[x.buffer_id],
                    results=[y.buffer_id],
                    runtime_scalars=scalars,
                    wait=True,
                ),
                metadata=client.metadata,
            )
            time.sleep(0.8)  # the kernel sleeps in the worker now
            started = time.monotonic()
            code = daemon.kill(signal.SIGTERM)  # to the whole group, as systemd does
            took = time.monotonic() - started
            reply = waited.result(timeout=10)
        logged = daemon.log_text()
    assert reply.completed, logged
    assert code == 0, logged
    assert took < 8.0, f"the drain took {took:.1f} s"
    assert "device worker faulted" not in logged
