"""Requests that can never succeed are refused before the daemon allocates anything for them."""

from __future__ import annotations

import numpy as np
import pytest

from accy import Client, errors
from accy.testing import running_daemon

MiB = 1 << 20


def test_run_refuses_an_operand_too_small_for_its_scalars_before_allocating() -> None:
    """Under a 1 MiB memory quota the refusal must name the operand, not the quota."""
    with (
        running_daemon(backend="host", tcp=False, extra=("--quota-memory", str(MiB))) as daemon,
        Client(daemon.unix_target) as client,
    ):
        with pytest.raises(errors.AccyError) as refused:
            client.run("accy.kernel.device_scan", np.ones(1, np.float32), n=2**28)
        assert isinstance(refused.value, errors.InvalidArgument), refused.value
        assert client.status().device_memory_in_use == 0
