"""One Unix socket path, one daemon: a successor's socket survives its draining predecessor."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from accy.protocol.launch.v1 import launch_pb2 as pb
from accyd.catalog import load_catalog
from accyd.errors import Unavailable
from tests.launch_service.harness import ServerThread, attach, make_config

SLOW = '''
[[kernel]]
target = "test.kernel.slow"
version = 1
format = "host_py"
entry = "slow"
code = """
import time

def slow(grid, block, buffers, scalars):
    time.sleep(1.5)
"""
buffers = 1
scalars = [{ name = "n", dtype = "u32" }]
grid = [1]
block = [1]

[[pipeline]]
target = "test.slow"
version = 1
scalars = [{ name = "n", dtype = "u32", min = 1, max = 1024 }]
operands = []
results = [{ name = "y", dtype = "u8", extent = "n" }]

[[pipeline.stage]]
kernel = "test.kernel.slow"
version = 1
buffers = ["y"]
scalars = ["n"]
'''


def eventually(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        return bool(health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == 1)


def test_a_second_daemon_on_a_served_path_is_refused_even_without_the_socket_file(
    tmp_path: Path,
) -> None:
    first = ServerThread(make_config(tmp_path, "unix"))
    try:
        (tmp_path / "accyd.sock").unlink()  # someone removed the file: the path is still served
        with pytest.raises(Unavailable, match="another daemon serves"):
            ServerThread(make_config(tmp_path, "unix"))
    finally:
        first.stop()
    second = ServerThread(make_config(tmp_path, "unix"))  # free again once the first stopped
    try:
        assert serving(second.address)
    finally:
        second.stop()


def test_a_draining_daemon_leaves_its_successors_socket_alone(tmp_path: Path) -> None:
    (tmp_path / "catalog").mkdir()
    (tmp_path / "catalog" / "slow.toml").write_text(SLOW)
    catalog = load_catalog([tmp_path / "catalog"])
    socket_path = tmp_path / "accyd.sock"
    old = ServerThread(make_config(tmp_path, "unix", grace_seconds=3.0), catalog)
    with grpc.insecure_channel(old.address) as channel:
        client = attach(channel)
        session = client.LoadPipeline(pb.LoadPipelineRequest(target="test.slow")).session_id
        out = client.AllocateBuffer(pb.AllocateBufferRequest(byte_size=16)).buffer_id
        client.Launch(
            pb.LaunchRequest(
                session_id=session, results=[out], runtime_scalars={"n": pb.Scalar(u32=16)}
            )
        )
        stopping = threading.Thread(target=old.stop)
        stopping.start()
        assert eventually(lambda: not socket_path.exists())  # it stopped listening
        new = ServerThread(make_config(tmp_path, "unix"))
        try:
            assert stopping.is_alive(), "the old daemon should still be draining"
            stopping.join(20)
            assert not stopping.is_alive()
            assert socket_path.exists(), "the old daemon removed its successor's socket"
            assert serving(new.address)
        finally:
            new.stop()
