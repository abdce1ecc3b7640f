"""Ring-stream clients SIGKILLed mid-stream: the daemon logs their end, nothing else."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from accy.testing import running_daemon

CLIENT = """
import sys
import numpy as np
from accy import Client
from accy.testing import transport_of

with Client(sys.argv[1]) as client, client.load("accy.kernel.saxpy") as saxpy:
    x = client.buffer(np.ones(1024, np.float32))
    saxpy.launch(operands=[x, x], results=[x], n=1024, a=1.0)
    assert transport_of(client).path == "ring-stream"
    print("launching", flush=True)
    while True:
        for _ in range(64):
            saxpy.launch(operands=[x, x], results=[x], n=1024, a=1.0, wait=False)
        saxpy.wait()
"""


def test_killed_ring_stream_clients_leave_no_stray_traceback() -> None:
    """An answer the daemon could not send to a killed client was an exception in a task
    nobody awaited: asyncio printed 'Task exception was never retrieved' and a traceback on
    stderr, outside the structured log."""
    with running_daemon(backend="host", extra=["--no-supervise"]) as daemon:
        assert daemon.tcp_target is not None
        for _ in range(6):
            client = subprocess.Popen(
                [sys.executable, "-c", CLIENT, daemon.tcp_target],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert client.stdout is not None
            assert client.stdout.readline().strip() == "launching"
            time.sleep(0.3)
            client.send_signal(signal.SIGKILL)
            client.wait()
        time.sleep(1.0)  # the streams' ends reach the daemon
        assert daemon.process.poll() is None
        text = daemon.log_text()
    assert "never retrieved" not in text, text[-4000:]
    assert "Traceback" not in text, text[-4000:]
