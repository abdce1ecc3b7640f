"""``accyd serve`` with SM partitions in its tokens file on the host backend: the one start
line saying they cannot be made, the metrics showing it, the tenant served unconfined, and
a bad file refused before serving, naming the file and the field."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np

from accy import Client
from accy.testing import free_port, running_daemon
from accyd.tokens import hash_token, new_token


def test_partitions_the_host_cannot_make_are_said_once_and_the_tenant_runs(
    tmp_path: Path,
) -> None:
    token = new_token()
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        '[partitions]\nbatch = { sms = 64 }\n[tenant.a]\npartition = "batch"\npriority = 2\n'
        f'[[token]]\ntenant = "a"\nsha256 = "{hash_token(token)}"\n'
    )
    port = free_port()
    extra = ["--tokens", str(tokens), "--metrics-port", str(port)]
    with running_daemon(backend="host", tcp=False, extra=extra) as daemon:
        with Client(daemon.unix_target, token=token) as client:
            session = client.load("accy.kernel.saxpy")
            x = client.buffer(np.ones(256, np.float32))
            y = client.buffer(np.zeros(256, np.float32))
            session.launch(operands=[x, y], results=[y], n=256, a=2.0, wait=True)
            assert float(y.read()[0]) == 2.0
            status = client.status()
        shown = subprocess.run(
            [sys.executable, "-m", "accy.cli", "--target", daemon.unix_target, "--token", token,
             "status"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
            metrics = page.read().decode()
        log = daemon.log.read_text(errors="replace")
    assert 'accy_device_partitions_unconfined{device="0"} 1.0' in metrics
    (tenant,) = status.tenants  # GetStatus says where the tenant runs, and why
    assert tenant.partition.startswith("unconfined: ") and tenant.priority == 2, tenant
    (device,) = status.devices
    assert "the host backend runs kernels on CPU threads" in device.unconfined, device
    assert device.partitions == ()
    assert tenant.partition in shown.stdout and device.unconfined in shown.stdout, shown
    lines = [line for line in log.splitlines() if "SM partitions" in line]
    assert len(lines) == 1, lines
    assert "not made on device 0: the host backend runs kernels on CPU threads" in lines[0]
    assert "their tenants run unconfined" in lines[0]


def test_a_bad_partition_refuses_the_start_naming_the_file_and_field(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        '[tenant.a]\npartition = "batch"\n'
        f'[[token]]\ntenant = "a"\nsha256 = "{hash_token(new_token())}"\n'
    )
    socket = f"unix:{tmp_path / 's.sock'}"
    done = subprocess.run(
        [sys.executable, "-m", "accyd.cli", "serve", "--backend", "host", "--no-supervise",
         "--tokens", str(tokens), "--listen", socket],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    assert f"{tokens}: [tenant.a]: field 'partition': must name a table of [partitions]" in (
        done.stderr
    ), done.stderr[-2000:]
