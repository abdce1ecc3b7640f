"""A client whose own launch faults one of two devices goes on: device-scoped on every path.

Through the shared ring (the default on a Unix socket) the faulting launch's ``DEVICE_LOST``
must say it took device 1 alone, as the gRPC error does: the client then reloads its session
there and goes on, with no reattaching, while its device-0 session never stops.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

from accy import Client, errors
from accy.protocol.ring import RING_ENV

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))  # the benchmark's modules import one another by bare name

from two_devices import two_device_daemon  # noqa: E402

SCAN, FAULT = "accy.kernel.device_scan", "accy.test.fault"
PROMPT = 5.0
"""Seconds the client's next calls may take after the fault (giving up reattaching: 30)."""


@pytest.mark.parametrize("way", ["1", "0"], ids=["ring", "unary"])
def test_a_client_that_faults_its_own_device_reloads_there_and_goes_on(
    way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RING_ENV, way)
    with two_device_daemon("host") as daemon, Client(daemon.unix_target) as client:
        healthy = client.load(SCAN, device=0)
        x0 = client.buffer(np.ones(64, np.float32), device=0)
        y0 = client.empty(64, "f32", device=0)
        healthy.launch([x0], [y0], n=64)
        culprit = client.load(FAULT, device=1)
        x1 = client.buffer(np.ones(16, np.float32), device=1)
        y1 = client.empty(16, "f32", device=1)
        with pytest.raises(errors.Unavailable) as caught:
            culprit.launch([x1], [y1], n=16)
        assert caught.value.reason == "DEVICE_LOST"
        assert caught.value.metadata.get("scope") == "device", caught.value.metadata
        assert caught.value.metadata.get("device") == "1"
        started = time.monotonic()
        healthy.launch([x0], [y0], n=64)  # device 0 never stopped
        np.testing.assert_array_equal(y0.read(), np.arange(1, 65, dtype=np.float32))
        while True:  # device 1 is replaced in a moment, then serves again
            try:
                again = client.load(SCAN, device=1)
                xs = client.buffer(np.ones(32, np.float32), device=1)
                ys = client.empty(32, "f32", device=1)
                again.launch([xs], [ys], n=32)
                break
            except errors.Unavailable as error:
                assert error.metadata.get("scope") == "device", error
                assert time.monotonic() - started < PROMPT, "device 1 did not serve again"
                time.sleep(0.01)
        np.testing.assert_array_equal(ys.read(), np.arange(1, 33, dtype=np.float32))
        assert time.monotonic() - started < PROMPT
        assert client.attached and client.reattachments == 0
