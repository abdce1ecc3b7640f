"""``accyd serve --device-launch`` on a GPU: a client's launches through its ring, launched by
the GPU itself, land in order, are read after, and are counted."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

from accy import Client
from accy.testing import running_daemon
from accyd.backends.cuda import cuda_available

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not cuda_available(), reason="no CUDA driver or device here"),
]

SAXPY = "accy.kernel.saxpy"


def test_launches_the_gpu_serves_run_in_order_and_are_counted() -> None:
    """acc = a * acc + 1 in place, two factors in turn: each is one ticket after its first
    sight, so the GPU launches the rest; any reordering changes the result. The last 100
    launches pipeline (two of three not waited for), which hands the ring back to the
    engine: the order holds across that too."""
    n, steps = 4096, 400
    factors = (np.float32(0.5), np.float32(-1.25))
    with running_daemon(backend="cuda", extra=["--device-launch", "always"]) as daemon:
        expected = np.zeros(n, np.float32)
        with Client(daemon.unix_target) as client, client.load(SAXPY) as session:
            acc = client.buffer(expected)
            ones = client.buffer(np.ones(n, np.float32))
            before = client.status().launches_total
            for k in range(steps):
                a = factors[k % 2]
                wait = k < 300 or k % 3 == 0  # waited launches, then pipelined ones
                session.launch(operands=[acc, ones], results=[acc], wait=wait, n=n, a=float(a))
                expected = a * expected + np.float32(1)
            got = acc.read()  # ordered after every launch, none waited for last
            np.testing.assert_allclose(got, expected, rtol=1e-5)
            deadline = time.monotonic() + 2.0
            while client.status().launches_total - before < steps:
                assert time.monotonic() < deadline, "the GPU's launches were not counted"
                time.sleep(0.05)
            other = client.buffer(np.ones(n, np.float32))  # new handles: new tickets
            ones.free()  # its tickets revoked: the GPU must not launch on it again
            session.launch(operands=[acc, other], results=[acc], wait=True, n=n, a=0.5)
            np.testing.assert_allclose(acc.read(), 0.5 * expected + 1, rtol=1e-5)
        daemon.stop()  # its log goes with the context
        log = daemon.log_text()
        print(log)  # shown where an assertion below fails
    assert "device launch is on" in log
    line = next(ln for ln in log.splitlines() if "ring engine stopped" in ln)
    made = re.search(r"device_launcher\W+\{[^}]*?launched\W+(\d+)", line)
    assert made is not None and int(made.group(1)) > 0, line
