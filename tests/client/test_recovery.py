"""A client gets over what happened to it: a device of its own lost, a reattach it gave up on."""

from __future__ import annotations

import numpy as np
import pytest

from accy import errors
from accy.client import Client
from accy.testing import transport_of
from tests.client.fake_daemon import FakeLaunchService

SCAN = "accy.kernel.device_scan"


def test_a_client_that_gave_up_reattaching_tries_again_on_its_next_call(
    fake: tuple[str, FakeLaunchService],
) -> None:
    target, service = fake
    with Client(target, reattach_timeout=0.3) as client:
        session = client.load(SCAN)
        service.refuse_attach = True
        service.restart()
        with pytest.raises(errors.Unavailable) as caught:
            client.status()
        assert caught.value.reason == "REATTACH_FAILED"
        with pytest.raises(errors.Unavailable, match="REATTACH_FAILED"):
            client.status()  # it tried again, and the daemon still refuses: why, again
        service.refuse_attach = False
        assert client.status().instance_id == "i2"  # tried again, and attached
        assert client.attached and client.reattachments == 1
        x, y = client.buffer(np.ones(4, np.float32)), client.empty(4, "f32")
        session.launch([x], [y], n=4)  # loaded again on the new daemon
        np.testing.assert_array_equal(y.read(), [1, 2, 3, 4])


def test_reattaching_off_stays_off(fake: tuple[str, FakeLaunchService]) -> None:
    target, service = fake
    with Client(target, reattach_timeout=0) as client:
        service.restart()
        for _ in range(2):
            with pytest.raises(errors.Unavailable, match="reattaching is off"):
                client.status()
        assert client.reattachments == 0


@pytest.mark.parametrize("rings", [True, False], ids=["ring-stream", "unary"])
def test_a_launch_that_faults_one_device_reloads_there_and_goes_on(
    fake: tuple[str, FakeLaunchService], rings: bool
) -> None:
    target, service = fake
    service.rings = rings
    with Client(target, client_name="own-fault") as client:
        on0, on1 = client.load(SCAN, device=0), client.load(SCAN, device=1)
        assert (on0.device, on1.device) == (0, 1)
        x, y = client.buffer(np.ones(4, np.float32)), client.empty(4, "f32")
        on0.launch([x], [y], n=4)
        on1.launch([x], [y], n=4)
        assert transport_of(client).path == ("ring-stream" if rings else "unary")
        service.fault_device(1)
        faulted = on1.id
        with pytest.raises(errors.Unavailable) as caught:
            on1.launch([x], [y], n=4)
        assert caught.value.reason == "DEVICE_LOST" and caught.value.session == faulted
        assert caught.value.metadata["scope"] == "device"
        assert caught.value.metadata["device"] == "1"
        # Device-scoped: no reattaching; the other device's session goes on at once.
        on0.launch([x], [y], n=4)
        assert client.attached and client.reattachments == 0
        on1.launch([x], [y], n=4)  # loaded again on device 1
        assert on1.id != faulted and service.state.devices[on1.id] == 1
        np.testing.assert_array_equal(y.read(), [1, 2, 3, 4])
